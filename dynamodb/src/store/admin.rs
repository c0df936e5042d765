//! Creating the claim table (its key, the open-claims index, on-demand
//! billing and TTL), and checking that a consumer can use it.

use std::time::Duration;

use aws_sdk_dynamodb::{
    client::Waiters,
    config::{ProvideCredentials, SharedCredentialsProvider},
    error::ProvideErrorMetadata,
    operation::create_table::CreateTableError,
    types::{
        AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
        ScalarAttributeType, TimeToLiveSpecification, TimeToLiveStatus,
    },
};

use super::DynamoDbStore;
use crate::{
    client::unavailable,
    layout::{OPEN_INDEX, OPEN_STATUS, TableKey},
};
use sqs_once_core::store::StoreError;

/// Whether DynamoDB says `table` does not exist (`ResourceNotFoundException`
/// to a `DescribeTable`). Any other answer, an error included, counts as
/// "not known to be missing".
pub(crate) async fn table_missing(client: &aws_sdk_dynamodb::Client, table: &str) -> bool {
    match client.describe_table().table_name(table).send().await {
        Ok(_) => false,
        Err(error) => error.code() == Some("ResourceNotFoundException"),
    }
}

/// Why a consumer cannot use its claim table, as one `DescribeTable` before
/// it starts finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// DynamoDB says the table does not exist.
    Missing,
    /// The client has no Region to send and sign its requests for.
    NoRegion,
    /// No credentials could be loaded: why.
    NoCredentials(String),
    /// DynamoDB refused the credentials, or the request could not be made
    /// (an endpoint that is no URL): why. Waiting would not change it.
    Unreachable(String),
    /// No answer came (a timeout, a connection refused or lost): why. It may
    /// come later.
    Silent(String),
}

/// Error codes with which DynamoDB refuses the request's credentials or
/// signature, whatever the request.
const REFUSED_CREDENTIALS: [&str; 5] = [
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "IncompleteSignatureException",
    "MissingAuthenticationTokenException",
    "ExpiredTokenException",
];

/// Whether `table` can be used through `client`: a `DescribeTable`, sent a
/// second time half a second later when no answer came (a connection reset
/// once must not stop a consumer that would have run: `poll` on a service
/// restarts into the same network), and then what kept the answer from
/// coming (no Region; no `credentials` from the provider the client was made
/// with, when known; else an endpoint that does not answer, or a request
/// that cannot be made, which is not sent twice). Any other
/// answer of DynamoDB (not allowed to describe the table, throttled) counts
/// as usable: records that cannot be claimed say why on their own.
pub async fn check_table(
    client: &aws_sdk_dynamodb::Client,
    credentials: Option<SharedCredentialsProvider>,
    table: &str,
) -> Result<(), Unusable> {
    if client.config().region().is_none() {
        return Err(Unusable::NoRegion);
    }
    let mut silent = None;
    for attempt in 0..2 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let Err(error) = client.describe_table().table_name(table).send().await else { return Ok(()) };
        match error.code() {
            Some("ResourceNotFoundException") => return Err(Unusable::Missing),
            Some(code) if REFUSED_CREDENTIALS.contains(&code) => {
                let refused = format!("it refused the credentials: {}", sqs_once_aws::describe(&error));
                return Err(Unusable::Unreachable(refused));
            }
            Some(_) => return Ok(()),
            None => {
                let unanswered = sqs_once_aws::unanswered(&error);
                silent = Some((error, unanswered));
                // A request that could not be made is not tried again.
                if !unanswered {
                    break;
                }
            }
        }
    }
    if let Some(credentials) = credentials
        && let Err(error) = credentials.provide_credentials().await
    {
        return Err(Unusable::NoCredentials(sqs_once_aws::with_causes(&error)));
    }
    let reason = silent.as_ref().map(|(error, _)| sqs_once_aws::describe(error)).unwrap_or_default();
    match silent {
        Some((_, true)) => Err(Unusable::Silent(reason)),
        _ => Err(Unusable::Unreachable(reason)),
    }
}

impl DynamoDbStore {
    /// Creates the table (on-demand billing, TTL on the expiry attribute).
    /// Returns `false` when it already existed; TTL is enabled either way.
    pub async fn create_table(&self) -> Result<bool, StoreError> {
        let layout = &self.layout;
        let id = layout.attributes.id.as_str();
        let mut keys = vec![(id, KeyType::Hash)];
        if let TableKey::Sorted { partition_attribute, .. } = &layout.key {
            keys = vec![(partition_attribute.as_str(), KeyType::Hash), (id, KeyType::Range)];
        }
        let open_claims = GlobalSecondaryIndex::builder()
            .index_name(OPEN_INDEX)
            .key_schema(key_element(OPEN_STATUS, KeyType::Hash)?)
            .key_schema(key_element(id, KeyType::Range)?)
            .projection(Projection::builder().projection_type(ProjectionType::All).build())
            .build()
            .map_err(StoreError::unavailable)?;
        let mut request = self
            .client
            .create_table()
            .table_name(&layout.table)
            .billing_mode(BillingMode::PayPerRequest)
            .global_secondary_indexes(open_claims);
        for name in keys.iter().map(|(name, _)| *name).chain([OPEN_STATUS]) {
            let definition =
                AttributeDefinition::builder().attribute_name(name).attribute_type(ScalarAttributeType::S).build();
            request = request.attribute_definitions(definition.map_err(StoreError::unavailable)?);
        }
        for (name, key_type) in keys {
            request = request.key_schema(key_element(name, key_type)?);
        }
        let created = match request.send().await {
            Ok(_) => true,
            Err(error) if matches!(error.as_service_error(), Some(CreateTableError::ResourceInUseException(_))) => {
                false
            }
            Err(error) => return Err(unavailable(error)),
        };
        self.client.wait_until_table_exists().table_name(&layout.table).wait(Duration::from_secs(120)).await.map_err(
            |error| StoreError::unavailable(format!("table {} did not become active: {error}", layout.table)),
        )?;
        self.enable_ttl().await?;
        Ok(created)
    }

    /// Turns TTL on for the expiry attribute, unless it is on or being
    /// turned on already: DynamoDB allows one change an hour, so running
    /// `create-table` again must not ask twice.
    async fn enable_ttl(&self) -> Result<(), StoreError> {
        let layout = &self.layout;
        let expiry = layout.attributes.expiry.as_str();
        let described = self.client.describe_time_to_live().table_name(&layout.table).send().await;
        let current = described.map_err(unavailable)?.time_to_live_description;
        let status = current.as_ref().and_then(|ttl| ttl.time_to_live_status.clone());
        let attribute = current.as_ref().and_then(|ttl| ttl.attribute_name.as_deref());
        match status {
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) if attribute == Some(expiry) => return Ok(()),
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) => {
                return Err(StoreError::Rejected(format!(
                    "table {} has TTL on `{}`, not on the expiry attribute `{expiry}`: set SQS_ONCE_ATTR_EXPIRY to it, \
                     or change the table's TTL",
                    layout.table,
                    attribute.unwrap_or("?"),
                )));
            }
            _ => {}
        }
        let ttl = TimeToLiveSpecification::builder()
            .attribute_name(expiry)
            .enabled(true)
            .build()
            .map_err(StoreError::unavailable)?;
        match self.client.update_time_to_live().table_name(&layout.table).time_to_live_specification(ttl).send().await {
            Ok(_) => Ok(()),
            Err(error) if error.message().is_some_and(|message| message.contains("already enabled")) => Ok(()),
            Err(error) => Err(unavailable(error)),
        }
    }
}

fn key_element(name: &str, key_type: KeyType) -> Result<KeySchemaElement, StoreError> {
    KeySchemaElement::builder().attribute_name(name).key_type(key_type).build().map_err(StoreError::unavailable)
}
