//! Cluster metadata in etcd (cargo feature `etcd`, on by default).
//!
//! Each engine writes its [`PeerRecord`] (JSON) at
//! `<prefix>/engines/<source id>`, attached to a lease of `lease_ttl`. A
//! background thread keeps the lease alive at a third of the TTL. When the
//! engine dies the keep-alives stop and etcd deletes the record when the
//! lease expires; [`EtcdMetadata::close`] revokes the lease at once.
//!
//! The store speaks etcd's JSON gateway: the v3 API (`/v3/kv/put`,
//! `/v3/kv/range`, `/v3/lease/grant`, `/v3/lease/keepalive`,
//! `/v3/lease/revoke`, `/v3/maintenance/status`) as HTTP/1.1 POSTs of JSON
//! bodies on the client port, which every etcd since 3.4 serves next to
//! gRPC. Keys and values travel base64-encoded, 64-bit integers as decimal
//! strings. Requests go through `ureq` (a small blocking HTTP
//! client): no gRPC stack, no async runtime, and no `protoc` at build time. TLS endpoints
//! (`https://`) are refused with that reason.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{MetadataError, PeerRecord};

/// Bound on one request (connect, send, answer).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read from etcd (a range over many records).
const MAX_ANSWER: u64 = 64 << 20;

/// A connection to etcd holding this engine's lease.
pub struct EtcdMetadata {
    endpoints: Vec<String>,
    prefix: String,
    lease_ttl: Duration,
    lease: Option<i64>,
    /// Dropping the sender stops the keep-alive thread.
    keeper: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl std::fmt::Debug for EtcdMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMetadata")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

fn service(endpoints: &str, e: impl std::fmt::Display) -> MetadataError {
    MetadataError::Service {
        endpoint: endpoints.to_owned(),
        reason: e.to_string(),
    }
}

impl EtcdMetadata {
    /// Connects to `endpoints` (`host:port`, or `http://host:port`) and
    /// checks that one of them is an etcd server. `prefix` names the
    /// cluster (`/orbitte/cluster-a`); `lease_ttl` is rounded up to whole
    /// seconds (at least 1).
    pub fn connect(
        endpoints: &[String],
        prefix: &str,
        lease_ttl: Duration,
    ) -> Result<Self, MetadataError> {
        let joined = endpoints.join(",");
        if endpoints.is_empty() {
            return Err(service(&joined, "no etcd endpoint given"));
        }
        let mut plain = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            if e.starts_with("https://") {
                return Err(service(
                    e,
                    "TLS endpoints are not supported: give an http:// or host:port endpoint",
                ));
            }
            plain.push(
                e.strip_prefix("http://")
                    .unwrap_or(e)
                    .trim_end_matches('/')
                    .to_owned(),
            );
        }
        let store = Self {
            endpoints: plain,
            prefix: prefix.trim_end_matches('/').to_owned(),
            lease_ttl,
            lease: None,
            keeper: None,
        };
        let status = store.call("/v3/maintenance/status", &json!({}))?;
        if status.get("version").and_then(Value::as_str).is_none() {
            return Err(service(
                &joined,
                "the server answered without an etcd version: is it an etcd client URL?",
            ));
        }
        Ok(store)
    }

    fn key(&self, source: &str) -> String {
        format!("{}/engines/{}", self.prefix, source)
    }

    fn call(&self, path: &str, body: &Value) -> Result<Value, MetadataError> {
        call_any(&self.endpoints, path, body)
    }

    /// Stores (or replaces) this engine's record under a lease kept alive
    /// in the background.
    pub fn publish(&mut self, record: &PeerRecord) -> Result<(), MetadataError> {
        let ttl = i64::try_from(self.lease_ttl.as_secs_f64().ceil() as u64)
            .unwrap_or(i64::MAX)
            .max(1);
        let lease = match self.lease {
            Some(l) => l,
            None => {
                let answer = self.call("/v3/lease/grant", &json!({ "TTL": ttl }))?;
                let id = int_field(&answer, "ID").ok_or_else(|| {
                    service(
                        &self.endpoints.join(","),
                        "lease grant answered without an ID",
                    )
                })?;
                self.lease = Some(id);
                self.start_keeper(id, ttl);
                id
            }
        };
        let key = self.key(&record.source_id);
        self.call(
            "/v3/kv/put",
            &json!({
                "key": base64::encode(key.as_bytes()),
                "value": base64::encode(&record.to_bytes()),
                "lease": lease.to_string(),
            }),
        )?;
        tracing::info!(source = %record.source_id, epoch = record.epoch, lease, "published record to etcd");
        Ok(())
    }

    fn start_keeper(&mut self, lease: i64, ttl: i64) {
        let (tx, rx) = mpsc::channel::<()>();
        let endpoints = self.endpoints.clone();
        let period = Duration::from_millis((ttl as u64 * 1000 / 3).max(200));
        let spawned = std::thread::Builder::new()
            .name("orbitte-etcd-lease".into())
            .spawn(move || {
                // Until the sender is dropped (stop) or sends.
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(period) {
                    let answer = call_any(
                        &endpoints,
                        "/v3/lease/keepalive",
                        &json!({ "ID": lease.to_string() }),
                    );
                    let alive = answer.as_ref().map(|a| {
                        a.get("result")
                            .and_then(|r| int_field(r, "TTL"))
                            .is_some_and(|t| t > 0)
                    });
                    match alive {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(endpoints = %endpoints.join(","), lease, "etcd lease expired; the record is gone until it is published again");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(endpoints = %endpoints.join(","), error = %e, "etcd lease keep-alive failed; retrying, the record expires if this lasts");
                        }
                    }
                }
            });
        match spawned {
            Ok(h) => self.keeper = Some((tx, h)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the etcd keep-alive thread; the record will expire")
            }
        }
    }

    /// The record of `source`, if one is stored (and its lease alive).
    pub fn lookup(&self, source: &str) -> Result<Option<PeerRecord>, MetadataError> {
        let key = self.key(source);
        let answer = self.call(
            "/v3/kv/range",
            &json!({ "key": base64::encode(key.as_bytes()) }),
        )?;
        match values(&answer)?.into_iter().next() {
            Some((_, v)) => PeerRecord::from_bytes(&v).map(Some),
            None => Ok(None),
        }
    }

    /// Every record under the prefix. Malformed records are skipped with a
    /// warning (another release may have written them).
    pub fn list(&self) -> Result<Vec<PeerRecord>, MetadataError> {
        let key = format!("{}/engines/", self.prefix).into_bytes();
        let answer = self.call(
            "/v3/kv/range",
            &json!({
                "key": base64::encode(&key),
                "range_end": base64::encode(&prefix_end(&key)),
            }),
        )?;
        let mut out = Vec::new();
        for (k, v) in values(&answer)? {
            match PeerRecord::from_bytes(&v) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::warn!(key = %String::from_utf8_lossy(&k).escape_debug(), error = %e, "skipping record")
                }
            }
        }
        Ok(out)
    }

    /// Stops the keep-alives without revoking: the record expires after
    /// the lease TTL, as if the engine had died (tests use this).
    pub fn abandon(mut self) {
        self.stop_keeper();
        self.lease = None;
    }

    fn stop_keeper(&mut self) {
        if let Some((tx, h)) = self.keeper.take() {
            drop(tx);
            let _ = h.join();
        }
    }

    /// Revokes the lease: the record disappears now.
    pub fn close(mut self) -> Result<(), MetadataError> {
        self.stop_keeper();
        if let Some(lease) = self.lease.take() {
            self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))?;
        }
        Ok(())
    }
}

impl Drop for EtcdMetadata {
    fn drop(&mut self) {
        // Dropping without close() leaves the lease to expire.
        self.stop_keeper();
    }
}

/// A 64-bit integer field, which the gateway writes as a decimal string.
fn int_field(v: &Value, name: &str) -> Option<i64> {
    match v.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// A stored key and its value.
type KeyValue = (Vec<u8>, Vec<u8>);

/// The (key, value) pairs of a range answer.
fn values(answer: &Value) -> Result<Vec<KeyValue>, MetadataError> {
    let Some(kvs) = answer.get("kvs").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    kvs.iter()
        .map(|kv| {
            let field = |name: &str| {
                let text = kv.get(name).and_then(Value::as_str).unwrap_or_default();
                base64::decode(text).ok_or_else(|| {
                    MetadataError::Malformed(format!("etcd answered a {name} that is not base64"))
                })
            };
            Ok((field("key")?, field("value")?))
        })
        .collect()
}

/// The end of etcd's range for every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: the range runs to the end of the key space.
    vec![0]
}

/// POSTs `body` to `path` on each endpoint in turn until one answers.
fn call_any(endpoints: &[String], path: &str, body: &Value) -> Result<Value, MetadataError> {
    let mut last = None;
    for e in endpoints {
        match post(e, path, body) {
            Ok(v) => return Ok(v),
            Err(Failure::Answered(reason)) => return Err(service(e, reason)),
            Err(Failure::Unreachable(reason)) => last = Some(service(e, reason)),
        }
    }
    Err(last.unwrap_or_else(|| service("", "no etcd endpoint given")))
}

enum Failure {
    /// No answer (connect, i/o, not HTTP): the next endpoint may answer.
    Unreachable(String),
    /// etcd answered with an error.
    Answered(String),
}

fn post(endpoint: &str, path: &str, body: &Value) -> Result<Value, Failure> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(REQUEST_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://{endpoint}{path}");
    let mut answer = agent
        .post(&url)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .map_err(|e| Failure::Unreachable(format!("no answer from {url}: {e}")))?;
    let status = answer.status().as_u16();
    let body = answer
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER)
        .read_to_vec()
        .map_err(|e| Failure::Unreachable(format!("reading the answer of {url}: {e}")))?;
    // The first JSON value (a keep-alive answer is a stream of them).
    let value = serde_json::Deserializer::from_slice(&body)
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok);
    if status != 200 {
        let message = value
            .as_ref()
            .and_then(|v| v.get("message").or_else(|| v.get("error")))
            .and_then(Value::as_str)
            .map_or_else(|| format!("HTTP status {status}"), str::to_owned);
        return Err(Failure::Answered(message));
    }
    value.ok_or_else(|| {
        Failure::Unreachable("the answer is not JSON: is it an etcd client URL?".into())
    })
}

/// etcd's JSON encoding of bytes: standard base64 with padding.
mod base64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    pub(super) fn encode(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    /// `None` when `text` is not padded standard base64.
    pub(super) fn decode(text: &str) -> Option<Vec<u8>> {
        STANDARD.decode(text).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_garbage() {
        for (plain, coded) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\xff\x00\xfe", "/wD+"),
        ] {
            assert_eq!(base64::encode(plain), coded);
            assert_eq!(base64::decode(coded).as_deref(), Some(plain));
        }
        for bad in ["Zg=", "Z===", "Zg==Zg==", "Zm9*"] {
            assert_eq!(base64::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
    }
}
