//! The ways to run a consumer: as the Lambda function ([`lambda`]), polling
//! a queue itself ([`poll`]), and the command line that serves either and
//! the offline and operator commands around them ([`crate::run`]).

pub(crate) mod cli;
pub mod lambda;
pub mod poll;
