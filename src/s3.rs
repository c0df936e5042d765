//! Payloads kept in S3, read, written and deleted with the AWS SDK
//! (feature `s3`).

use async_trait::async_trait;
use aws_config::SdkConfig;

use sqs_once_core::payload::{PayloadError, PayloadPointer, PayloadStore};

/// The S3 client payloads are read with, built from the shared SDK
/// configuration ([`sqs_once_aws::sdk_config`]) when the first pointer
/// arrives, so that a consumer that never receives one never loads it.
/// `AWS_ENDPOINT_URL_S3` points it elsewhere (a local S3 server, addressed
/// by path since it has no bucket host names).
#[derive(Debug, Default)]
pub(crate) struct S3Payloads {
    config: Option<SdkConfig>,
    client: tokio::sync::OnceCell<aws_sdk_s3::Client>,
}

impl S3Payloads {
    /// Payloads read through a client of `config`, or of the SDK's default
    /// configuration, loaded when first needed.
    pub(crate) fn new(config: Option<&SdkConfig>) -> Self {
        Self { config: config.cloned(), client: tokio::sync::OnceCell::new() }
    }

    async fn client(&self) -> &aws_sdk_s3::Client {
        self.client
            .get_or_init(|| async {
                let config = match &self.config {
                    Some(config) => config.clone(),
                    None => sqs_once_aws::sdk_config().await,
                };
                let by_path =
                    ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"].iter().any(|name| std::env::var_os(name).is_some());
                let s3 = aws_sdk_s3::config::Builder::from(&config).force_path_style(by_path).build();
                aws_sdk_s3::Client::from_conf(s3)
            })
            .await
    }
}

#[async_trait]
impl PayloadStore for S3Payloads {
    async fn get(&self, pointer: &PayloadPointer, limit: u64) -> Result<String, PayloadError> {
        let unavailable = |reason: String| PayloadError::Unavailable { pointer: pointer.clone(), reason };
        let too_large = |size: u64| PayloadError::TooLarge { pointer: pointer.clone(), size, limit };
        let object = self.client().await.get_object().bucket(&pointer.bucket).key(&pointer.key).send().await;
        let object = match object {
            Ok(object) => object,
            Err(error) => {
                let code = error.as_service_error().and_then(|error| error.meta().code()).map(str::to_owned);
                return Err(refused(pointer, code.as_deref(), sqs_once_aws::describe(&error)));
            }
        };
        let announced = object.content_length().map_or(0, |length| u64::try_from(length).unwrap_or(0));
        if announced > limit {
            return Err(too_large(announced));
        }
        // Read once into a buffer of the announced size, and never past the limit.
        let mut payload = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
        let mut body = object.body;
        while let Some(chunk) = body.try_next().await.map_err(|error| unavailable(error.to_string()))? {
            let size = (payload.len() + chunk.len()) as u64;
            if size > limit {
                return Err(too_large(size));
            }
            payload.extend_from_slice(&chunk);
        }
        String::from_utf8(payload).map_err(|_| PayloadError::NotText(pointer.clone()))
    }

    async fn put(&self, pointer: &PayloadPointer, payload: &str) -> Result<(), PayloadError> {
        let body = aws_sdk_s3::primitives::ByteStream::from(payload.as_bytes().to_vec());
        let put = self.client().await.put_object().bucket(&pointer.bucket).key(&pointer.key).body(body);
        let written = put.content_type("application/octet-stream").send().await;
        written.map(drop).map_err(|error| PayloadError::Unavailable {
            pointer: pointer.clone(),
            reason: sqs_once_aws::describe(&error),
        })
    }

    async fn delete(&self, pointer: &PayloadPointer) -> Result<(), PayloadError> {
        let deleted = self.client().await.delete_object().bucket(&pointer.bucket).key(&pointer.key).send().await;
        deleted.map(drop).map_err(|error| PayloadError::Unavailable {
            pointer: pointer.clone(),
            reason: sqs_once_aws::describe(&error),
        })
    }
}

/// What S3's refusal of a read of `pointer` (its error `code`, described as
/// `described`) says: an object that is not there (`NoSuchKey`; or
/// `AccessDenied`, as S3 answers a missing object to a reader that may not
/// list the bucket), a bucket this client cannot reach however often it
/// asks (in another Region, or gone), or a refusal another delivery may not
/// meet.
fn refused(pointer: &PayloadPointer, code: Option<&str>, described: String) -> PayloadError {
    let pointer = pointer.clone();
    match code {
        Some("NoSuchKey") => PayloadError::Missing(pointer),
        Some("AccessDenied") => PayloadError::Unavailable {
            pointer,
            reason: format!(
                "{described}: the object is missing (S3 answers AccessDenied for a missing object to a reader without \
                 s3:ListBucket on the bucket) or the function may not read it (s3:GetObject)"
            ),
        },
        Some("PermanentRedirect" | "AuthorizationHeaderMalformed" | "IllegalLocationConstraintException") => {
            PayloadError::Unreachable {
                pointer,
                reason: format!("{described}: the bucket is in another Region than this consumer's S3 client"),
            }
        }
        Some("NoSuchBucket") => {
            PayloadError::Unreachable { pointer, reason: format!("{described}: the bucket does not exist") }
        }
        _ => PayloadError::Unavailable { pointer, reason: described },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer() -> PayloadPointer {
        PayloadPointer { bucket: "payloads".into(), key: "k-1".into() }
    }

    #[test]
    fn a_missing_object_reads_as_missing_or_denied_and_another_regions_bucket_fails_for_good() {
        assert_eq!(refused(&pointer(), Some("NoSuchKey"), "NoSuchKey".into()), PayloadError::Missing(pointer()));
        let denied = refused(&pointer(), Some("AccessDenied"), "AccessDenied: Access Denied".into());
        let text = denied.to_string();
        assert!(matches!(denied, PayloadError::Unavailable { .. }), "{denied:?}");
        assert!(text.contains("the object is missing") && text.contains("s3:ListBucket"), "{text}");
        for code in ["PermanentRedirect", "AuthorizationHeaderMalformed"] {
            let elsewhere = refused(&pointer(), Some(code), code.into());
            assert!(matches!(elsewhere, PayloadError::Unreachable { .. }), "{code}: {elsewhere:?}");
            assert!(elsewhere.to_string().contains("another Region"), "{elsewhere}");
        }
        let slow = refused(&pointer(), Some("SlowDown"), "SlowDown".into());
        assert!(matches!(slow, PayloadError::Unavailable { .. }), "tried again: {slow:?}");
    }
}
