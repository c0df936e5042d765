//! The DynamoDB store's part of the assembly: its clients (given, or made
//! from the SDK's configuration and counting their requests), the start-up
//! check of its table, and the store on it.

use std::sync::Arc;

use aws_config::SdkConfig;
use sqs_once_dynamodb::{RequestCounter, Unusable};

use super::{Builder, Needs, OpenStore};
use crate::{
    config::Config,
    consumer::StartupError,
    store::{DynamoDbStore, TableLayout},
};

impl Builder {
    /// The DynamoDB store on `layout`'s table, refused at the start (outside
    /// a deployed function) when the table cannot be used.
    pub(super) async fn dynamodb_store_open(
        &mut self,
        layout: &TableLayout,
        config: &Config,
        aws: Option<&SdkConfig>,
        needs: Needs,
    ) -> Result<OpenStore, StartupError> {
        let table = self.dynamodb_table(aws).await;
        // Looked for with one DescribeTable, on a client that counts nothing: no metric shows it.
        if !crate::environment::Environment::current().deployed() {
            refuse_unusable_table(&table, &layout.table, needs.long_running).await?;
        }
        let target = format!("table {} at {}", layout.table, table.endpoint);
        let operation_timeout = sqs_once_aws::operation_timeout(table.client.config().timeout_config());
        let store = DynamoDbStore::new(table.client, layout.clone()).batching(config.dynamodb_batching);
        Ok(OpenStore { store: Arc::new(store), requests: table.requests, target, operation_timeout })
    }

    /// The DynamoDB client given, or one made from `aws` (the SDK's default
    /// configuration when there is none), counting its requests.
    async fn dynamodb_table(&mut self, aws: Option<&SdkConfig>) -> DynamoDbTable {
        if let Some(client) = self.dynamodb.take().map(sqs_once_dynamodb::with_limits) {
            let endpoint = "the endpoint of the DynamoDB client given".to_owned();
            return DynamoDbTable { uncounted: client.clone(), client, requests: None, endpoint, credentials: None };
        }
        let loaded;
        let aws = match aws {
            Some(aws) => aws,
            None => {
                loaded = sqs_once_aws::sdk_config().await;
                &loaded
            }
        };
        let (client, requests) = sqs_once_dynamodb::client_from(aws);
        let uncounted = aws_sdk_dynamodb::Client::new(aws);
        let credentials = aws.credentials_provider();
        DynamoDbTable { client, uncounted, requests: Some(requests), endpoint: dynamodb_endpoint(aws), credentials }
    }

    /// The DynamoDB store on `layout`'s table and where it is, for
    /// `create-table`: the table need not exist yet.
    #[cfg(feature = "cli")]
    pub(crate) async fn dynamodb_store(&mut self, layout: TableLayout) -> (DynamoDbStore, String) {
        let aws = self.sdk_config.take().map(|given| sqs_once_aws::with_limits(&given));
        let table = self.dynamodb_table(aws.as_ref()).await;
        (DynamoDbStore::new(table.client, layout), table.endpoint)
    }
}

/// Refuses to start on a claim table that cannot be used, naming what is
/// wrong and where it was looked for; one that does not answer is waited
/// for when `wait` (a long-running command).
async fn refuse_unusable_table(dynamodb: &DynamoDbTable, table: &str, wait: bool) -> Result<(), StartupError> {
    use std::ops::ControlFlow;
    let endpoint = dynamodb.endpoint.clone();
    // Boxed: inlined, the wait's futures nest past the compiler's query depth in `run`.
    let checked = Box::pin(crate::waiting::until_answered("the claim table", async || {
        match sqs_once_dynamodb::check_table(&dynamodb.uncounted, dynamodb.credentials.clone(), table).await {
            Err(Unusable::Silent(reason)) if wait => ControlFlow::Continue(reason),
            checked => ControlFlow::Break(checked),
        }
    }))
    .await;
    checked.map_err(|unusable| match unusable {
        Unusable::Missing => StartupError::MissingTable { table: table.to_owned(), endpoint },
        Unusable::NoRegion => StartupError::NoRegion,
        Unusable::NoCredentials(reason) => StartupError::NoCredentials { reason },
        Unusable::Unreachable(reason) | Unusable::Silent(reason) => StartupError::StoreUnreachable { endpoint, reason },
    })
}

/// The DynamoDB clients of a claim table, and where they reach it.
struct DynamoDbTable {
    client: aws_sdk_dynamodb::Client,
    /// The same, counting no request (the given client counts what it counts).
    uncounted: aws_sdk_dynamodb::Client,
    requests: Option<Arc<RequestCounter>>,
    endpoint: String,
    /// Where the clients' credentials come from, when known (not for a
    /// client given): what the start-up check asks when DynamoDB does not
    /// answer.
    credentials: Option<aws_sdk_dynamodb::config::SharedCredentialsProvider>,
}

/// Where the DynamoDB clients made from `aws` send their requests, for
/// logs and errors: the endpoint set for DynamoDB, or AWS in the
/// configuration's Region.
fn dynamodb_endpoint(aws: &SdkConfig) -> String {
    crate::environment::endpoint("AWS_ENDPOINT_URL_DYNAMODB", aws.region())
}
