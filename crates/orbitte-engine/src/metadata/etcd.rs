//! Cluster metadata in etcd (cargo feature `etcd`).
//!
//! Each engine writes its [`PeerRecord`] (JSON) at
//! `<prefix>/engines/<source id>`, attached to a lease of `lease_ttl`. A
//! background thread keeps the lease alive at a third of the TTL. When the
//! engine dies the keep-alives stop and etcd deletes the record when the
//! lease expires; [`EtcdMetadata::close`] revokes the lease at once.
//!
//! etcd-client is async; this store owns a small tokio runtime (one worker
//! thread, which also drives the client's connection and the keep-alive
//! task) and blocks on it, so the rest of the engine stays synchronous.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{Client, GetOptions, PutOptions};

use super::{MetadataError, PeerRecord};

/// A connection to etcd holding this engine's lease.
pub struct EtcdMetadata {
    runtime: tokio::runtime::Runtime,
    client: Client,
    endpoints: String,
    prefix: String,
    lease_ttl: Duration,
    lease: Option<i64>,
    stop: Arc<AtomicBool>,
    keeper: Option<tokio::task::JoinHandle<()>>,
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
    /// Connects to `endpoints` (`host:port`). `prefix` names the cluster
    /// (`/orbitte/cluster-a`); `lease_ttl` is rounded up to whole seconds
    /// (at least 1).
    pub fn connect(
        endpoints: &[String],
        prefix: &str,
        lease_ttl: Duration,
    ) -> Result<Self, MetadataError> {
        let joined = endpoints.join(",");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("orbitte-etcd")
            .enable_all()
            .build()
            .map_err(|e| {
                service(
                    &joined,
                    format!("cannot start the etcd client runtime: {e}"),
                )
            })?;
        let client = runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(10), Client::connect(endpoints, None))
                    .await
            })
            .map_err(|_| service(&joined, "connect timed out after 10 s"))?
            .map_err(|e| service(&joined, e))?;
        Ok(Self {
            runtime,
            client,
            endpoints: joined,
            prefix: prefix.trim_end_matches('/').to_owned(),
            lease_ttl,
            lease: None,
            stop: Arc::new(AtomicBool::new(false)),
            keeper: None,
        })
    }

    fn key(&self, source: &str) -> String {
        format!("{}/engines/{}", self.prefix, source)
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
                let mut c = self.client.clone();
                let id = self
                    .runtime
                    .block_on(async move { c.lease_grant(ttl, None).await })
                    .map_err(|e| service(&self.endpoints, e))?
                    .id();
                self.lease = Some(id);
                self.start_keeper(id, ttl);
                id
            }
        };
        let key = self.key(&record.source_id);
        let value = record.to_bytes();
        let mut c = self.client.clone();
        self.runtime
            .block_on(async move {
                c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                    .await
            })
            .map_err(|e| service(&self.endpoints, e))?;
        tracing::info!(source = %record.source_id, epoch = record.epoch, lease, "published record to etcd");
        Ok(())
    }

    fn start_keeper(&mut self, lease: i64, ttl: i64) {
        let stop = self.stop.clone();
        let mut client = self.client.clone();
        let period = Duration::from_millis((ttl as u64 * 1000 / 3).max(200));
        let endpoints = self.endpoints.clone();
        self.keeper = Some(self.runtime.spawn(async move {
            let (mut keeper, mut stream) = match client.lease_keep_alive(lease).await {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!(%endpoints, error = %e, "etcd lease keep-alive failed; the record will expire");
                    return;
                }
            };
            while !stop.load(Ordering::Acquire) {
                if let Err(e) = keeper.keep_alive().await {
                    tracing::warn!(%endpoints, error = %e, "etcd lease keep-alive failed; the record will expire");
                    return;
                }
                let _ = tokio::time::timeout(period, stream.message()).await;
                tokio::time::sleep(period).await;
            }
        }));
    }

    /// The record of `source`, if one is stored (and its lease alive).
    pub fn lookup(&self, source: &str) -> Result<Option<PeerRecord>, MetadataError> {
        let key = self.key(source);
        let mut c = self.client.clone();
        let resp = self
            .runtime
            .block_on(async move { c.get(key, None).await })
            .map_err(|e| service(&self.endpoints, e))?;
        match resp.kvs().first() {
            Some(kv) => PeerRecord::from_bytes(kv.value()).map(Some),
            None => Ok(None),
        }
    }

    /// Every record under the prefix. Malformed records are skipped with a
    /// warning (another release may have written them).
    pub fn list(&self) -> Result<Vec<PeerRecord>, MetadataError> {
        let key = format!("{}/engines/", self.prefix);
        let mut c = self.client.clone();
        let resp = self
            .runtime
            .block_on(async move { c.get(key, Some(GetOptions::new().with_prefix())).await })
            .map_err(|e| service(&self.endpoints, e))?;
        let mut out = Vec::new();
        for kv in resp.kvs() {
            match PeerRecord::from_bytes(kv.value()) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::warn!(key = %String::from_utf8_lossy(kv.key()), error = %e, "skipping record")
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
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.keeper.take() {
            h.abort();
        }
    }

    /// Revokes the lease: the record disappears now.
    pub fn close(mut self) -> Result<(), MetadataError> {
        self.stop_keeper();
        if let Some(lease) = self.lease.take() {
            let mut c = self.client.clone();
            self.runtime
                .block_on(async move { c.lease_revoke(lease).await })
                .map_err(|e| service(&self.endpoints, e))?;
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
