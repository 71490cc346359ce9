//! An object store that fails on purpose (a test double): it wraps a real store and, as
//! told at run time, fails one operation in n at random (an error, throttling, a timeout, a
//! full disk; seeded, so a run repeats), or truncates reads. Writes that fail are never half-done: the inner store is not
//! called.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};

/// How an injected failure looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// A plain error (a 500 from the store, a reset connection).
    #[default]
    Error,
    /// The store says to slow down (S3's 503 SlowDown).
    Throttle,
    /// The operation hangs, then fails (after [`Faults::delay`]).
    Timeout,
    /// No space left on the device.
    DiskFull,
}

/// What to inject. The default injects nothing.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Fail one operation in this many, at random (1: all of them; 0: none).
    pub fail_one_in: u64,
    /// Only writes (puts, deletes, copies) fail.
    pub writes_only: bool,
    /// How they fail.
    pub fault: Fault,
    /// Truncate one read in this many to half its bytes, at random (1: all; 0: none).
    pub truncate_one_in: u64,
    /// How long a [`Fault::Timeout`] hangs.
    pub delay: Duration,
}

/// A store wrapper that injects [`Faults`].
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Mutex<Faults>,
    rng: Mutex<fastrand::Rng>,
    injected: AtomicU64,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl FaultyStore {
    /// Wraps `inner`, injecting nothing yet.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            faults: Mutex::new(Faults::default()),
            rng: Mutex::new(fastrand::Rng::with_seed(7)),
            injected: AtomicU64::new(0),
        })
    }

    /// From now on, inject these.
    pub fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap() = faults;
    }

    /// Failures and truncations injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// The error to fail this operation with, if it is one to fail.
    async fn fault(&self, write: bool) -> object_store::Result<()> {
        let f = self.faults.lock().unwrap().clone();
        if (f.writes_only && !write) || !self.one_in(f.fail_one_in) {
            return Ok(());
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        let source: Box<dyn std::error::Error + Send + Sync> = match f.fault {
            Fault::Error => Box::new(std::io::Error::other("injected: the store failed")),
            Fault::Throttle => {
                Box::new(std::io::Error::other("injected: 503 SlowDown, please reduce your request rate"))
            }
            Fault::Timeout => {
                tokio::time::sleep(f.delay).await;
                Box::new(std::io::Error::new(std::io::ErrorKind::TimedOut, "injected: operation timed out"))
            }
            Fault::DiskFull => {
                Box::new(std::io::Error::new(std::io::ErrorKind::StorageFull, "injected: no space left on device"))
            }
        };
        Err(object_store::Error::Generic { store: "faulty", source })
    }

    fn one_in(&self, n: u64) -> bool {
        n != 0 && self.rng.lock().unwrap().u64(..n) == 0
    }

    fn truncates(&self) -> bool {
        let n = self.faults.lock().unwrap().truncate_one_in;
        self.one_in(n)
    }
}

#[async_trait::async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.fault(true).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.fault(true).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.fault(false).await?;
        let result = self.inner.get_opts(location, options).await?;
        if options_head(&result) || !self.truncates() {
            return Ok(result);
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        let (meta, range, attributes) = (result.meta.clone(), result.range.clone(), result.attributes.clone());
        let bytes = result.bytes().await?;
        let half: Bytes = bytes.slice(..bytes.len() / 2);
        Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::once(async move { Ok(half) }).boxed()),
            meta,
            range,
            attributes,
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.fault(false).await?;
        self.inner.get_ranges(location, ranges).await
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.fault(true).await?;
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.list(prefix);
        let f = self.faults.lock().unwrap().clone();
        let fail = !f.writes_only && self.one_in(f.fail_one_in);
        if fail {
            self.injected.fetch_add(1, Ordering::SeqCst);
            let e = object_store::Error::Generic {
                store: "faulty",
                source: Box::new(std::io::Error::other("injected: listing failed")),
            };
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        inner
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.fault(false).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.fault(true).await?;
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.fault(true).await?;
        self.inner.copy_if_not_exists(from, to).await
    }
}

/// A `head` request carries no body to truncate.
fn options_head(result: &GetResult) -> bool {
    result.range.is_empty()
}
