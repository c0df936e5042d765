//! `template.yaml` deploys what the README promises: partial batch responses,
//! a dead-letter queue, a visibility timeout that outlasts retries, a claim
//! table the store can use, and a role that can do nothing but claim and act
//! on failed records.

use std::collections::BTreeSet;

use serde_yaml::{Value, value::TaggedValue};
use sqs_once::store::dynamodb::{self, Attributes};

fn template() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn resource<'t>(template: &'t Value, name: &str) -> &'t Value {
    &template["Resources"][name]
}

/// `!GetAtt Name.Attribute`, as written in the template.
fn get_att(target: &str) -> Value {
    Value::Tagged(Box::new(TaggedValue { tag: serde_yaml::value::Tag::new("GetAtt"), value: target.into() }))
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value:?}"))
}

#[test]
fn the_function_is_a_rust_arm64_lambda_built_from_this_binary() {
    let template = template();
    let globals = &template["Globals"]["Function"];
    assert_eq!(globals["Runtime"], "provided.al2023");
    assert_eq!(globals["Architectures"][0], "arm64");
    assert_eq!(globals["Handler"], "bootstrap");
    assert_eq!(globals["LoggingConfig"]["LogFormat"], "JSON");
    let function = resource(&template, "ConsumerFunction");
    assert_eq!(function["Metadata"]["BuildMethod"], "rust-cargolambda");
    assert_eq!(function["Metadata"]["BuildProperties"]["Binary"], env!("CARGO_PKG_NAME"));
    let variables = &function["Properties"]["Environment"]["Variables"];
    for name in
        ["SQS_ONCE_HANDLER", "SQS_ONCE_KEY", "SQS_ONCE_CONCURRENCY", "SQS_ONCE_EXPIRES_AFTER_SECS", "SQS_ONCE_TABLE"]
    {
        assert!(variables.get(name).is_some(), "{name} is not set");
    }
}

#[test]
fn the_event_source_reports_batch_item_failures() {
    let template = template();
    let work = &resource(&template, "ConsumerFunction")["Properties"]["Events"]["Work"];
    assert_eq!(work["Type"], "SQS");
    assert_eq!(work["Properties"]["Queue"], get_att("WorkQueue.Arn"));
    assert_eq!(work["Properties"]["FunctionResponseTypes"], Value::Sequence(vec!["ReportBatchItemFailures".into()]));
    for parameter in ["BatchSize", "MaximumConcurrency"] {
        assert!(template["Parameters"].get(parameter).is_some(), "{parameter} is not a parameter");
    }
}

#[test]
fn the_queue_has_a_dead_letter_queue_and_outlasts_six_function_timeouts() {
    let template = template();
    let queue = &resource(&template, "WorkQueue")["Properties"];
    assert_eq!(queue["RedrivePolicy"]["deadLetterTargetArn"], get_att("DeadLetterQueue.Arn"));
    assert!(queue["RedrivePolicy"].get("maxReceiveCount").is_some());
    let timeout = number(&template["Globals"]["Function"]["Timeout"]);
    assert!(resource(&template, "ConsumerFunction")["Properties"].get("Timeout").is_none(), "timeout overridden");
    assert!(number(&queue["VisibilityTimeout"]) >= 6 * timeout);
    assert_eq!(queue["SqsManagedSseEnabled"], true);
    assert_eq!(resource(&template, "DeadLetterQueue")["Properties"]["SqsManagedSseEnabled"], true);
}

#[test]
fn the_table_matches_the_store_layout() {
    let template = template();
    let table = &resource(&template, "IdempotencyTable")["Properties"];
    let attributes = Attributes::default();
    assert_eq!(table["BillingMode"], "PAY_PER_REQUEST");
    assert_eq!(table["KeySchema"][0]["AttributeName"], attributes.id.as_str());
    assert_eq!(table["KeySchema"][0]["KeyType"], "HASH");
    assert_eq!(table["AttributeDefinitions"][0]["AttributeType"], "S");
    assert_eq!(table["TimeToLiveSpecification"]["AttributeName"], attributes.expiry.as_str());
    assert_eq!(table["TimeToLiveSpecification"]["Enabled"], true);
    assert_eq!(table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"], true);
    let index = &table["GlobalSecondaryIndexes"][0];
    assert_eq!(index["IndexName"], dynamodb::OPEN_INDEX);
    assert_eq!(index["KeySchema"][0]["AttributeName"], dynamodb::OPEN_STATUS);
    assert_eq!(index["KeySchema"][1]["AttributeName"], attributes.id.as_str());
}

#[test]
fn the_role_may_only_claim_on_its_table_and_act_on_failed_records_of_its_queues() {
    let template = template();
    let policies = resource(&template, "ConsumerFunction")["Properties"]["Policies"].as_sequence().unwrap();
    assert_eq!(policies.len(), 1, "no policy templates such as DynamoDBCrudPolicy");
    let statements = policies[0]["Statement"].as_sequence().unwrap();
    let grants: BTreeSet<(Vec<&str>, String)> = statements
        .iter()
        .map(|statement| {
            assert_eq!(statement["Effect"], "Allow");
            let mut actions: Vec<&str> =
                statement["Action"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
            actions.sort();
            (actions, serde_yaml::to_string(&statement["Resource"]).unwrap())
        })
        .collect();
    let on = |target: &str| serde_yaml::to_string(&get_att(target)).unwrap();
    let expected = BTreeSet::from([
        (
            vec![
                "dynamodb:BatchGetItem",
                "dynamodb:DeleteItem",
                "dynamodb:GetItem",
                "dynamodb:PartiQLDelete",
                "dynamodb:PartiQLInsert",
                "dynamodb:PartiQLUpdate",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
            ],
            on("IdempotencyTable.Arn"),
        ),
        (vec!["sqs:ChangeMessageVisibility"], on("WorkQueue.Arn")),
        (vec!["sqs:SendMessage"], on("DeadLetterQueue.Arn")),
    ]);
    assert_eq!(grants, expected);
    let text = serde_yaml::to_string(policies).unwrap();
    assert!(!text.contains('*'), "no wildcards in the role: {text}");
    // The dead-letter queue the role may send to is the one the function sends to.
    let variables = &resource(&template, "ConsumerFunction")["Properties"]["Environment"]["Variables"];
    let reference = Value::Tagged(Box::new(TaggedValue {
        tag: serde_yaml::value::Tag::new("Ref"),
        value: "DeadLetterQueue".into(),
    }));
    assert_eq!(variables["SQS_ONCE_DLQ_URL"], reference);
}

#[test]
fn a_fifo_variant_is_one_parameter_away() {
    let template = template();
    assert!(template["Parameters"]["QueueType"]["AllowedValues"].as_sequence().unwrap().contains(&"fifo".into()));
    let queue = &resource(&template, "WorkQueue")["Properties"];
    assert!(matches!(&queue["FifoQueue"], Value::Tagged(tagged) if tagged.tag == "If"));
    let work = &resource(&template, "ConsumerFunction")["Properties"]["Events"]["Work"]["Properties"];
    // FIFO event sources take no batching window.
    assert!(matches!(&work["MaximumBatchingWindowInSeconds"], Value::Tagged(tagged) if tagged.tag == "If"));
}

#[test]
fn the_outputs_name_what_a_user_needs() {
    let template = template();
    for output in ["QueueUrl", "DeadLetterQueueUrl", "TableName", "FunctionName"] {
        assert!(template["Outputs"].get(output).is_some(), "{output} missing");
    }
}
