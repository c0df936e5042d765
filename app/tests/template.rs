//! `template.yaml` deploys what the README promises: partial batch responses,
//! a dead-letter queue, a visibility timeout that outlasts retries, a claim
//! table the store can use, a role that can do nothing but claim and act on
//! failed records, and alarms and a dashboard on the metrics it publishes;
//! and so does the template `sqs-once new` writes for a crate of one's own.

use crate::common;

use std::{collections::BTreeSet, io::Write, process::Stdio};

use serde_yaml::{Value, value::TaggedValue};
use sqs_once::store::Attributes;

/// The sparse index of open claims, and its partition key (docs/dynamodb.md).
const OPEN_INDEX: &str = "open-claims";
const OPEN_STATUS: &str = "open_status";

/// The namespace metrics are published in unless `SQS_ONCE_METRICS_NAMESPACE` says otherwise.
const NAMESPACE: &str = "sqs-once";

fn template() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// The crate `sqs-once new` writes in the tests of its template.
const NEW_CRATE: &str = "payments";

/// The repository's template and the one `sqs-once new` writes: every
/// promise below holds for both.
fn templates() -> [Value; 2] {
    let dir = tempfile::tempdir().unwrap();
    let output = common::command_in(dir.path()).args(["new", NEW_CRATE]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let written = std::fs::read_to_string(dir.path().join(NEW_CRATE).join("template.yaml")).unwrap();
    [template(), serde_yaml::from_str(&written).unwrap()]
}

/// Whether `template` is the repository's, with the bundled handlers' parts.
fn bundled(template: &Value) -> bool {
    template["Parameters"].get("HandlerName").is_some()
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
    assert!(env!("CARGO_BIN_EXE_sqs-once").ends_with("sqs-once"));
    for template in templates() {
        let globals = &template["Globals"]["Function"];
        assert_eq!(globals["Runtime"], "provided.al2023");
        assert_eq!(globals["Architectures"][0], "arm64");
        assert_eq!(globals["Handler"], "bootstrap");
        assert_eq!(globals["LoggingConfig"]["LogFormat"], "JSON");
        let function = resource(&template, "ConsumerFunction");
        assert_eq!(function["Metadata"]["BuildMethod"], "rust-cargolambda");
        assert_eq!(function["Properties"]["CodeUri"], "./");
        let binary = if bundled(&template) { "sqs-once" } else { NEW_CRATE };
        assert_eq!(function["Metadata"]["BuildProperties"]["Binary"], binary);
        let variables = &function["Properties"]["Environment"]["Variables"];
        for name in ["SQS_ONCE_CONCURRENCY", "SQS_ONCE_EXPIRES_AFTER_SECS", "SQS_ONCE_TABLE"] {
            assert!(variables.get(name).is_some(), "{name} is not set");
        }
        assert_eq!(
            variables.get("SQS_ONCE_HANDLER").is_some(),
            bundled(&template),
            "only the bundled binary has a registry"
        );
        // A crate of one's own sets its key in code; the bundled binary takes it from the template.
        assert_eq!(variables.get("SQS_ONCE_KEY").is_some(), bundled(&template), "the key's one source");
    }
}

#[test]
fn the_envelope_parameter_offers_exactly_the_envelopes_the_consumer_opens() {
    for template in templates() {
        let parameter = &template["Parameters"]["MessageEnvelope"];
        assert_eq!(parameter["Default"], "none");
        let allowed: Vec<&str> =
            parameter["AllowedValues"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(allowed, ["none", "sns", "eventbridge"]);
        for value in allowed {
            assert!(starts_with_envelope(value), "the consumer refuses SQS_ONCE_ENVELOPE={value}");
        }
        assert!(!starts_with_envelope("kinesis"), "the consumer takes an envelope the template does not offer");
        let variables = &resource(&template, "ConsumerFunction")["Properties"]["Environment"]["Variables"];
        assert_eq!(variables["SQS_ONCE_ENVELOPE"], reference("MessageEnvelope"));
    }
}

#[test]
fn the_event_source_reports_batch_item_failures() {
    for template in templates() {
        let work = &resource(&template, "ConsumerFunction")["Properties"]["Events"]["Work"];
        assert_eq!(work["Type"], "SQS");
        assert_eq!(work["Properties"]["Queue"], get_att("WorkQueue.Arn"));
        assert_eq!(
            work["Properties"]["FunctionResponseTypes"],
            Value::Sequence(vec!["ReportBatchItemFailures".into()])
        );
        for parameter in ["BatchSize", "MaximumConcurrency", "MinimumPollers", "MaximumPollers", "EventSourceMetrics"] {
            assert!(template["Parameters"].get(parameter).is_some(), "{parameter} is not a parameter");
        }
    }
}

#[test]
fn the_queue_has_a_dead_letter_queue_outlasts_six_function_timeouts_and_the_function_knows_its_timeout() {
    for template in templates() {
        let queue = &resource(&template, "WorkQueue")["Properties"];
        assert_eq!(queue["RedrivePolicy"]["deadLetterTargetArn"], get_att("DeadLetterQueue.Arn"));
        assert!(queue["RedrivePolicy"].get("maxReceiveCount").is_some());
        let timeout = number(&template["Globals"]["Function"]["Timeout"]);
        assert!(resource(&template, "ConsumerFunction")["Properties"].get("Timeout").is_none(), "timeout overridden");
        assert!(number(&queue["VisibilityTimeout"]) >= 6 * timeout);
        // The function remembers completed keys past the queue's redelivery: it must know the timeout.
        let variables = &resource(&template, "ConsumerFunction")["Properties"]["Environment"]["Variables"];
        let told: u64 = variables["SQS_ONCE_VISIBILITY_TIMEOUT_SECS"].as_str().unwrap().parse().unwrap();
        assert_eq!(told, number(&queue["VisibilityTimeout"]));
        assert_eq!(queue["SqsManagedSseEnabled"], true);
        assert_eq!(resource(&template, "DeadLetterQueue")["Properties"]["SqsManagedSseEnabled"], true);
    }
}

#[test]
fn the_table_matches_the_store_layout() {
    for template in templates() {
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
        assert_eq!(index["IndexName"], OPEN_INDEX);
        assert_eq!(index["KeySchema"][0]["AttributeName"], OPEN_STATUS);
        assert_eq!(index["KeySchema"][1]["AttributeName"], attributes.id.as_str());
    }
}

/// A statement's actions, sorted, and its resource as YAML.
fn grant(statement: &Value) -> (Vec<&str>, String) {
    assert_eq!(statement["Effect"], "Allow");
    let mut actions: Vec<&str> =
        statement["Action"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    actions.sort();
    (actions, serde_yaml::to_string(&statement["Resource"]).unwrap())
}

#[test]
fn the_role_may_only_claim_act_on_failed_records_and_touch_what_the_handler_is_given() {
    for template in templates() {
        let policies = resource(&template, "ConsumerFunction")["Properties"]["Policies"].as_sequence().unwrap();
        assert_eq!(policies.len(), 1, "no policy templates such as DynamoDBCrudPolicy");
        let statements = policies[0]["Statement"].as_sequence().unwrap();
        // Statements granted whatever the handler, and those granted on a condition (`!If [Condition, Statement, !Ref AWS::NoValue]`).
        let (conditional, always): (Vec<&Value>, Vec<&Value>) =
            statements.iter().partition(|statement| matches!(statement, Value::Tagged(tagged) if tagged.tag == "If"));
        let grants: BTreeSet<(Vec<&str>, String)> = always.iter().map(|statement| grant(statement)).collect();
        let on = |target: &str| serde_yaml::to_string(&get_att(target)).unwrap();
        let sub = |text: &str| {
            let value =
                Value::Tagged(Box::new(TaggedValue { tag: serde_yaml::value::Tag::new("Sub"), value: text.into() }));
            serde_yaml::to_string(&value).unwrap()
        };
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
            (vec!["dynamodb:Query"], sub(&format!("${{IdempotencyTable.Arn}}/index/{OPEN_INDEX}"))),
            (vec!["sqs:ChangeMessageVisibility"], on("WorkQueue.Arn")),
            (vec!["sqs:SendMessage"], on("DeadLetterQueue.Arn")),
        ]);
        assert_eq!(grants, expected);
        let given: BTreeSet<(String, Vec<&str>, String)> = conditional
            .iter()
            .map(|statement| {
                let Value::Tagged(tagged) = statement else { unreachable!() };
                let branches = tagged.value.as_sequence().unwrap();
                assert_eq!(branches[2], reference("AWS::NoValue"), "nothing granted otherwise");
                let (actions, resource) = grant(&branches[1]);
                (branches[0].as_str().unwrap().to_owned(), actions, resource)
            })
            .collect();
        let parameter = |name: &str| serde_yaml::to_string(&reference(name)).unwrap();
        let mut expected_given = BTreeSet::from([
            (
                "HasHandlerTables".to_owned(),
                vec![
                    "dynamodb:ConditionCheckItem",
                    "dynamodb:DeleteItem",
                    "dynamodb:DescribeTable",
                    "dynamodb:PartiQLUpdate",
                    "dynamodb:PutItem",
                    "dynamodb:UpdateItem",
                ],
                parameter("HandlerTableArns"),
            ),
            ("HasHandlerQueues".to_owned(), vec!["sqs:SendMessage"], parameter("HandlerQueueArns")),
            ("HasHandlerTopics".to_owned(), vec!["sns:Publish"], parameter("HandlerTopicArns")),
            ("HasHandlerEventBuses".to_owned(), vec!["events:PutEvents"], parameter("HandlerEventBusArns")),
            // The objects of the large-payload bucket, read and written; deleted only when asked.
            ("HasLargePayloadBucket".to_owned(), vec!["s3:GetObject", "s3:PutObject"], sub(LARGE_PAYLOAD_OBJECTS)),
            // The bucket listed, so that S3 answers a missing object NoSuchKey, not AccessDenied.
            ("HasLargePayloadBucket".to_owned(), vec!["s3:ListBucket"], sub(LARGE_PAYLOAD_BUCKET)),
            ("DeletesLargePayloads".to_owned(), vec!["s3:DeleteObject"], sub(LARGE_PAYLOAD_OBJECTS)),
            // X-Ray's actions name no resource: the one wildcard, with a collector layer only.
            ("Traced".to_owned(), vec!["xray:PutTelemetryRecords", "xray:PutTraceSegments"], "'*'\n".to_owned()),
        ]);
        if bundled(&template) {
            let balances = vec!["dynamodb:PartiQLUpdate", "dynamodb:UpdateItem"];
            expected_given.insert(("IsLedger".to_owned(), balances, on("LedgerTable.Arn")));
            expected_given.insert(("IsLedger".to_owned(), vec!["sqs:SendMessage"], on("LedgerNoticeQueue.Arn")));
        }
        assert_eq!(given, expected_given);
        assert_eq!(
            template["Parameters"]["LargePayloadBucket"]["Default"], "",
            "no bucket, nothing granted by default"
        );
        assert_eq!(template["Parameters"]["LargePayloadDelete"]["Default"], "false");
        for name in ["HandlerTableArns", "HandlerQueueArns", "HandlerTopicArns", "HandlerEventBusArns"] {
            assert_eq!(template["Parameters"][name]["Type"], "CommaDelimitedList", "{name}");
            assert_eq!(template["Parameters"][name]["Default"], "", "{name}: nothing granted by default");
        }
        // Besides X-Ray's, the one wildcard is the large-payload bucket's objects (their resources are checked above).
        let others: Vec<&Value> = statements
            .iter()
            .filter(|statement| {
                !["Traced", "HasLargePayloadBucket", "DeletesLargePayloads"].iter().any(|on| mentions(statement, on))
            })
            .collect();
        let text = serde_yaml::to_string(&others).unwrap();
        assert!(!text.contains('*'), "no other wildcard in the role: {text}");
        // The dead-letter queue the role may send to is the one the function sends to.
        let variables = &resource(&template, "ConsumerFunction")["Properties"]["Environment"]["Variables"];
        assert_eq!(variables["SQS_ONCE_DLQ_URL"], reference("DeadLetterQueue"));
    }
}

/// The objects of the bucket the `LargePayloadBucket` parameter names.
const LARGE_PAYLOAD_OBJECTS: &str = "arn:${AWS::Partition}:s3:::${LargePayloadBucket}/*";

/// The bucket the `LargePayloadBucket` parameter names.
const LARGE_PAYLOAD_BUCKET: &str = "arn:${AWS::Partition}:s3:::${LargePayloadBucket}";

/// Whether `statement` is granted on `condition`.
fn mentions(statement: &Value, condition: &str) -> bool {
    matches!(statement, Value::Tagged(tagged) if tagged.value.as_sequence().unwrap()[0] == condition)
}

#[test]
fn a_collector_layer_given_traces_every_batch_through_it_and_nothing_otherwise() {
    for template in templates() {
        assert_eq!(template["Parameters"]["TracingCollectorLayer"]["Default"], "", "no tracing by default");
        let function = &resource(&template, "ConsumerFunction")["Properties"];
        let layers = serde_yaml::to_string(&function["Layers"]).unwrap();
        assert_eq!(layers, "- !If\n  - Traced\n  - !Ref TracingCollectorLayer\n  - !Ref AWS::NoValue\n");
        let variables = &function["Environment"]["Variables"];
        for (name, value) in
            [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"), ("OTEL_TRACES_SAMPLER", "always_on")]
        {
            let expected = format!("!If\n- Traced\n- {value}\n- !Ref AWS::NoValue\n");
            assert_eq!(serde_yaml::to_string(&variables[name]).unwrap(), expected, "{name}");
        }
        assert!(function.get("Tracing").is_none(), "SAM would add X-Ray's managed policy whatever its condition");
    }
}

#[test]
fn the_ledger_handler_gets_its_balances_and_notice_queue_from_the_stack() {
    let template = template();
    let condition = &template["Conditions"]["IsLedger"];
    assert_eq!(serde_yaml::to_string(condition).unwrap().trim(), "!Equals\n- !Ref HandlerName\n- ledger");
    for name in ["LedgerTable", "LedgerNoticeQueue"] {
        assert_eq!(resource(&template, name)["Condition"], "IsLedger", "{name}");
    }
    let table = &resource(&template, "LedgerTable")["Properties"];
    assert_eq!(table["KeySchema"][0]["AttributeName"], "pk");
    let variables = &resource(&template, "ConsumerFunction")["Properties"]["Environment"]["Variables"];
    for (name, target) in
        [("SQS_ONCE_LEDGER_TABLE", "LedgerTable"), ("SQS_ONCE_LEDGER_NOTIFY_URL", "LedgerNoticeQueue")]
    {
        let text = serde_yaml::to_string(&variables[name]).unwrap();
        assert!(text.contains("IsLedger") && text.contains(target) && text.contains("AWS::NoValue"), "{name}: {text}");
    }
}

#[test]
fn a_new_consumers_template_is_the_repositorys_without_the_bundled_handlers() {
    let [repository, new] = templates();
    let names = |template: &Value, section: &str| -> BTreeSet<String> {
        template[section].as_mapping().unwrap().keys().map(|key| key.as_str().unwrap().to_owned()).collect()
    };
    let bundled = |section: &str, bundled: &[&str]| -> BTreeSet<String> {
        let mut left = names(&repository, section);
        bundled.iter().for_each(|name| assert!(left.remove(*name), "{section}: no {name}"));
        left
    };
    assert_eq!(names(&new, "Parameters"), bundled("Parameters", &["HandlerName", "IdempotencyKey"]));
    assert_eq!(names(&new, "Conditions"), bundled("Conditions", &["IsLedger"]));
    assert_eq!(names(&new, "Resources"), bundled("Resources", &["LedgerTable", "LedgerNoticeQueue"]));
    assert_eq!(names(&new, "Outputs"), bundled("Outputs", &["LedgerTableName", "LedgerNoticeQueueUrl"]));
    let text = serde_yaml::to_string(&new).unwrap();
    assert!(!text.contains("Ledger") && !text.contains("HandlerName") && !text.contains("SQS_ONCE_KEY"), "{text}");
}

#[test]
fn a_fifo_variant_is_one_parameter_away() {
    for template in templates() {
        assert!(template["Parameters"]["QueueType"]["AllowedValues"].as_sequence().unwrap().contains(&"fifo".into()));
        let queue = &resource(&template, "WorkQueue")["Properties"];
        assert!(matches!(&queue["FifoQueue"], Value::Tagged(tagged) if tagged.tag == "If"));
        let work = &resource(&template, "ConsumerFunction")["Properties"]["Events"]["Work"]["Properties"];
        // FIFO event sources take no batching window.
        assert!(matches!(&work["MaximumBatchingWindowInSeconds"], Value::Tagged(tagged) if tagged.tag == "If"));
    }
}

#[test]
fn the_outputs_name_what_a_user_needs() {
    for template in templates() {
        for output in ["QueueUrl", "DeadLetterQueueUrl", "TableName", "FunctionName"] {
            assert!(template["Outputs"].get(output).is_some(), "{output} missing");
        }
    }
}

/// `!Ref Name`, as written in the template.
fn reference(target: &str) -> Value {
    Value::Tagged(Box::new(TaggedValue { tag: serde_yaml::value::Tag::new("Ref"), value: target.into() }))
}

/// Whether `sqs-once invoke` starts with `SQS_ONCE_ENVELOPE` set to `value`.
fn starts_with_envelope(value: &str) -> bool {
    let mut invoke = common::sqs_once_command()
        .args(["invoke", "-"])
        .env("SQS_ONCE_STORE", "memory")
        .env("SQS_ONCE_ENVELOPE", value)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    invoke.stdin.take().unwrap().write_all(br#"{"Records": []}"#).unwrap();
    invoke.wait().unwrap().success()
}

/// Every metric the function publishes, as docs/outcomes.md lists them
/// (the library's tests hold its EMF line to that list).
fn published_metrics() -> BTreeSet<String> {
    testkit::documented_metrics()
}

fn alarms(template: &Value) -> Vec<(&str, &Value)> {
    template["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, resource)| resource["Type"] == "AWS::CloudWatch::Alarm")
        .map(|(name, resource)| (name.as_str().unwrap(), &resource["Properties"]))
        .collect()
}

#[test]
fn alarms_watch_dead_letters_failed_records_function_errors_and_queue_age() {
    for template in templates() {
        let alarms = alarms(&template);
        let watched: BTreeSet<(String, String, String)> = alarms
            .iter()
            .map(|(name, alarm)| {
                let dimensions = alarm["Dimensions"].as_sequence().unwrap();
                assert_eq!(dimensions.len(), 1, "{name}: one dimension");
                let target = serde_yaml::to_string(&dimensions[0]).unwrap();
                (
                    alarm["Namespace"].as_str().unwrap().to_owned(),
                    alarm["MetricName"].as_str().unwrap().to_owned(),
                    target,
                )
            })
            .collect();
        let dimension = |name: &str, value: Value| {
            let mut mapping = serde_yaml::Mapping::new();
            mapping.insert("Name".into(), name.into());
            mapping.insert("Value".into(), value);
            serde_yaml::to_string(&Value::Mapping(mapping)).unwrap()
        };
        let function = || dimension("FunctionName", reference("ConsumerFunction"));
        let namespace = NAMESPACE.to_owned();
        let expected = BTreeSet::from([
            (
                "AWS/SQS".to_owned(),
                "ApproximateNumberOfMessagesVisible".to_owned(),
                dimension("QueueName", get_att("DeadLetterQueue.QueueName")),
            ),
            (
                "AWS/SQS".to_owned(),
                "ApproximateAgeOfOldestMessage".to_owned(),
                dimension("QueueName", get_att("WorkQueue.QueueName")),
            ),
            (namespace.clone(), "FailedPermanent".to_owned(), function()),
            (namespace.clone(), "FailedStoreError".to_owned(), function()),
            (namespace.clone(), "OutboxFailed".to_owned(), function()),
            (namespace.clone(), "OutboxOldestAge".to_owned(), function()),
            ("AWS/Lambda".to_owned(), "Errors".to_owned(), function()),
        ]);
        assert_eq!(watched, expected);

        let published = published_metrics();
        for (name, alarm) in &alarms {
            if alarm["Namespace"] == namespace.as_str() {
                assert!(published.contains(alarm["MetricName"].as_str().unwrap()), "{name}: not a published metric");
            }
            assert_eq!(alarm["ComparisonOperator"], "GreaterThanThreshold", "{name}");
            match alarm["MetricName"].as_str() {
                // Every scheduled sweep publishes the outbox's age: no data is a sweep not heard from.
                Some("OutboxOldestAge") => {
                    let missing = serde_yaml::to_string(&alarm["TreatMissingData"]).unwrap();
                    assert_eq!(missing, "!If\n- SweepsOnSchedule\n- breaching\n- notBreaching\n", "{name}");
                }
                _ => assert_eq!(alarm["TreatMissingData"], "notBreaching", "{name}: no data is no failure"),
            }
            let actions = serde_yaml::to_string(&alarm["AlarmActions"]).unwrap();
            assert!(actions.contains("AlarmTopicArn") && actions.contains("AlarmTopic"), "{name}: {actions}");
            assert_eq!(alarm["OKActions"], alarm["AlarmActions"], "{name}");
            let threshold = match alarm["MetricName"].as_str() {
                Some("ApproximateAgeOfOldestMessage") => reference("OldestMessageAlarmSeconds"),
                Some("OutboxOldestAge") => reference("OutboxAgeAlarmSeconds"),
                _ => Value::from(0),
            };
            assert_eq!(alarm["Threshold"], threshold, "{name}: any failure alarms, an age past its setting");
        }
    }
}

#[test]
fn a_schedule_sweeps_the_outbox_when_the_queue_is_quiet() {
    let sample: serde_json::Value =
        serde_json::from_str(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../events/outbox-sweep.json")))
            .unwrap();
    for template in templates() {
        let schedule = &resource(&template, "ConsumerFunction")["Properties"]["Events"]["OutboxSweep"];
        assert_eq!(schedule["Type"], "ScheduleV2");
        let input: serde_json::Value = serde_json::from_str(schedule["Properties"]["Input"].as_str().unwrap()).unwrap();
        assert_eq!(input, sample, "the schedule sends the sample event");
        let state = serde_yaml::to_string(&schedule["Properties"]["State"]).unwrap();
        assert_eq!(state, "!If\n- SweepsOnSchedule\n- ENABLED\n- DISABLED\n");
        let minutes = &template["Parameters"]["OutboxSweepMinutes"];
        assert_eq!(minutes["Default"], "5", "on by default");
        for choice in minutes["AllowedValues"].as_sequence().unwrap() {
            let periods = &template["Mappings"]["OutboxSweeps"][choice.as_str().unwrap()];
            let seconds = number(&periods["Seconds"]);
            let expression = periods["Expression"].as_str().unwrap();
            match choice.as_str().unwrap() {
                "0" => assert_eq!(seconds, 60, "no schedule: the alarm as before"),
                minutes => {
                    let minutes: u64 = minutes.parse().unwrap();
                    assert_eq!(seconds, minutes * 60, "the alarm's period is the schedule's");
                    let unit = if minutes == 1 { "minute" } else { "minutes" };
                    assert_eq!(expression, format!("rate({minutes} {unit})"));
                }
            }
        }
    }
}

#[test]
fn alarms_notify_a_topic_given_or_one_of_the_stack_with_an_optional_email() {
    for template in templates() {
        for parameter in ["AlarmEmail", "AlarmTopicArn", "OldestMessageAlarmSeconds", "OutboxAgeAlarmSeconds"] {
            assert!(template["Parameters"].get(parameter).is_some(), "{parameter} is not a parameter");
        }
        assert_eq!(template["Parameters"]["AlarmEmail"]["Default"], "");
        assert_eq!(template["Parameters"]["AlarmTopicArn"]["Default"], "");
        assert_eq!(resource(&template, "AlarmTopic")["Condition"], "CreateAlarmTopic");
        let subscription = resource(&template, "AlarmEmailSubscription");
        assert_eq!(subscription["Condition"], "HasAlarmEmail");
        assert_eq!(subscription["Properties"]["Protocol"], "email");
        assert_eq!(subscription["Properties"]["Endpoint"], reference("AlarmEmail"));
        assert!(template["Outputs"].get("AlarmTopicArn").is_some());
    }
}

#[test]
fn the_dashboard_graphs_published_metrics_and_shows_every_alarm() {
    for template in templates() {
        let Value::Tagged(body) = &resource(&template, "Dashboard")["Properties"]["DashboardBody"] else {
            panic!("the dashboard body is not a !Sub")
        };
        assert_eq!(body.tag, "Sub");
        // `${...}` references become plain strings, which leaves JSON.
        let text = body.value.as_str().unwrap();
        let mut json = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            let end = start + rest[start..].find('}').unwrap();
            json.push_str(&rest[..start]);
            json.push_str(&rest[start + 2..end].replace('.', "_"));
            rest = &rest[end + 1..];
        }
        json.push_str(rest);
        let body: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|error| panic!("{error}: {json}"));
        let widgets = body["widgets"].as_array().unwrap();

        let namespace = NAMESPACE.to_owned();
        let published = published_metrics();
        let mut graphed = BTreeSet::new();
        for widget in widgets.iter().filter(|widget| widget["type"] == "metric") {
            let mut current = String::new();
            for metric in widget["properties"]["metrics"].as_array().unwrap() {
                let metric = metric.as_array().unwrap();
                match metric[0].as_str() {
                    Some(".") => {}
                    Some("...") => continue,
                    Some(namespace) => current = namespace.to_owned(),
                    None => panic!("a metric row without a namespace: {metric:?}"),
                }
                if current == namespace {
                    let name = metric[1].as_str().unwrap().to_owned();
                    assert!(published.contains(&name), "{name} is graphed but never published");
                    graphed.insert(name);
                }
            }
        }
        for name in [
            "Processed",
            "Duplicates",
            "Conflicts",
            "Failed",
            "FailedPermanent",
            "FailedStoreError",
            "FailedUncommitted",
            "OutboxFailed",
            "OutboxOldestAge",
        ] {
            assert!(graphed.contains(name), "{name} is not on the dashboard");
        }
        let shown: BTreeSet<&str> = widgets
            .iter()
            .filter(|widget| widget["type"] == "alarm")
            .flat_map(|widget| widget["properties"]["alarms"].as_array().unwrap())
            .map(|alarm| alarm.as_str().unwrap())
            .collect();
        let alarms: BTreeSet<String> = alarms(&template).iter().map(|(name, _)| format!("{name}_Arn")).collect();
        assert_eq!(shown, alarms.iter().map(String::as_str).collect());
    }
}

#[test]
fn the_local_endpoints_exist_for_sam_local_invoke_only_and_env_json_sets_each() {
    let env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../env.json")).unwrap())
            .unwrap();
    for template in templates() {
        // A stack always has a name: deployed, the condition never holds and the variables do not exist.
        let condition = &template["Conditions"]["SamLocalOnly"];
        let Value::Tagged(equals) = condition else { panic!("SamLocalOnly: {condition:?}") };
        assert_eq!(equals.tag, "Equals");
        assert_eq!(equals.value, Value::Sequence(vec![reference("AWS::StackName"), "".into()]));
        let variables = &resource(&template, "ConsumerFunction")["Properties"]["Environment"]["Variables"];
        for name in [
            "AWS_ENDPOINT_URL_DYNAMODB",
            "AWS_ENDPOINT_URL_SQS",
            "AWS_ENDPOINT_URL_SNS",
            "AWS_ENDPOINT_URL_EVENTBRIDGE",
            "AWS_ENDPOINT_URL_S3",
        ] {
            let Value::Tagged(value) = &variables[name] else { panic!("{name}: {:?}", variables[name]) };
            assert_eq!(value.tag, "If", "{name}");
            let Value::Sequence(parts) = &value.value else { panic!("{name}") };
            assert_eq!((&parts[0], &parts[2]), (&Value::from("SamLocalOnly"), &reference("AWS::NoValue")), "{name}");
            let local = env["ConsumerFunction"][name].as_str().unwrap_or_else(|| panic!("env.json sets no {name}"));
            assert!(local.starts_with("http://host.docker.internal:"), "{name}: {local}");
        }
    }
}
