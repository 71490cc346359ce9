//! Objects larger than one request carries. S3 takes at most 5 GiB in one PUT and copies at
//! most 5 GiB in one request; a workspace of ~100,000 files has a segment near that. Larger
//! objects are written in parts, and copied by reading them and writing the copy in parts
//! (bytes pass through this process then; below the limit a copy stays inside the bucket).

use futures::StreamExt as _;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, WriteMultipart};

use crate::Result;

/// The largest object written or copied in one request (S3's limit for both).
pub const ONE_REQUEST: usize = 5 << 30;

/// Parts of a larger object.
const PART: usize = 64 << 20;

/// Parts uploaded at once.
const PARTS_AT_ONCE: usize = 4;

/// Writes a new object: in one request that fails if the path exists when it fits in
/// `one_request` bytes, else in parts (names written so are unique by construction: a
/// sequence number and a nonce).
pub(crate) async fn put_new(
    store: &dyn ObjectStore,
    path: &ObjPath,
    bytes: bytes::Bytes,
    one_request: usize,
) -> Result<()> {
    if bytes.len() <= one_request {
        let create = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        store.put_opts(path, PutPayload::from_bytes(bytes), create).await?;
        return Ok(());
    }
    let mut upload = WriteMultipart::new_with_chunk_size(store.put_multipart(path).await?, PART.min(one_request));
    for part in bytes.chunks(PART) {
        upload.wait_for_capacity(PARTS_AT_ONCE).await?;
        upload.put(bytes.slice_ref(part));
    }
    upload.finish().await?;
    Ok(())
}

/// Copies an object: inside the bucket when it fits in `one_request` bytes (a hard link on
/// a local directory, a server-side copy on S3), else read and written again in parts.
pub(crate) async fn copy(store: &dyn ObjectStore, from: &ObjPath, to: &ObjPath, one_request: usize) -> Result<()> {
    let size = store.head(from).await?.size;
    if size <= one_request as u64 {
        store.copy(from, to).await?;
        return Ok(());
    }
    let mut upload = WriteMultipart::new_with_chunk_size(store.put_multipart(to).await?, PART.min(one_request));
    let mut read = store.get(from).await?.into_stream();
    let mut copied = 0u64;
    while let Some(bytes) = read.next().await {
        let bytes = bytes?;
        copied += bytes.len() as u64;
        upload.wait_for_capacity(PARTS_AT_ONCE).await?;
        upload.put(bytes);
    }
    if copied != size {
        upload.abort().await?;
        return Err(crate::Error::ShortRead { object: from.to_string(), got: copied, expected: size });
    }
    upload.finish().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Past the one-request limit, objects are written and copied in parts, and read back the
    /// same; below it, a second write of the same path is refused. On a local directory, in
    /// memory, and on S3 (moto) where the tests have it (parts there are 5 MiB at least).
    #[tokio::test]
    async fn objects_past_one_request_go_in_parts_and_read_back_whole() {
        let dir = caret_test_support::TempDir::new();
        let mut stores: Vec<Arc<dyn ObjectStore>> = vec![
            Arc::new(object_store::memory::InMemory::new()),
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
        ];
        match std::env::var("CARET_TEST_OBJECT_STORE").ok().and_then(|s| s.strip_prefix("s3://").map(str::to_owned)) {
            Some(bucket) => {
                let s3 = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).build().unwrap();
                let prefix = format!("objects-{}", fastrand::u64(..));
                stores.push(Arc::new(object_store::prefix::PrefixStore::new(s3, prefix.as_str())));
            }
            None => caret_test_support::skip("objects in parts on S3: CARET_TEST_OBJECT_STORE is not set"),
        }
        let limit = 5 << 20;
        let data: bytes::Bytes = (0..3_000_000u32).flat_map(u32::to_le_bytes).collect::<Vec<u8>>().into();
        for store in stores {
            let (big, small) = (ObjPath::from("a/big"), ObjPath::from("a/small"));
            put_new(store.as_ref(), &big, data.clone(), limit).await.unwrap();
            put_new(store.as_ref(), &small, data.slice(..1000), limit).await.unwrap();
            assert!(put_new(store.as_ref(), &small, data.slice(..10), limit).await.is_err(), "{store}: exists");
            copy(store.as_ref(), &big, &ObjPath::from("b/big"), limit).await.unwrap();
            copy(store.as_ref(), &small, &ObjPath::from("b/small"), limit).await.unwrap();
            for path in ["a/big", "b/big"] {
                let got = store.get(&ObjPath::from(path)).await.unwrap().bytes().await.unwrap();
                assert!(got == data, "{store}: {path} differs");
            }
            let got = store.get(&ObjPath::from("b/small")).await.unwrap().bytes().await.unwrap();
            assert_eq!(got, data.slice(..1000));
            assert!(copy(store.as_ref(), &ObjPath::from("a/none"), &ObjPath::from("b/none"), 1).await.is_err());
        }
    }
}
