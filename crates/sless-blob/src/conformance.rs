//! The behaviour every [`BlobStore`] shares, as one test run against each
//! implementation (the local directory, and S3 through moto).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use crate::store::{BlobError, BlobStore, Stored, sha256_hex};

/// Replaces the stored bytes of a key behind the store's back (bit rot, a bad
/// restore, a hand edit).
pub(crate) type Tamper<'a> =
    &'a (dyn Fn(String, Vec<u8>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Sync);

const EMPTY_SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Runs every shared check against an empty `store`.
pub(crate) async fn check(store: &dyn BlobStore, tamper: Tamper<'_>) {
    store.ping().await.expect("ping");
    round_trip_and_idempotence(store).await;
    missing_and_invalid_keys(store).await;
    corrupt_blobs(store, tamper).await;
    listing_and_removal(store).await;
}

async fn round_trip_and_idempotence(store: &dyn BlobStore) {
    let data = Bytes::from_static(b"PK\x05\x06 some archive");
    let (sha, stored) = store.put(data.clone()).await.expect("put");
    assert_eq!(stored, Stored::New);
    assert_eq!(sha, sha256_hex(&data));
    assert_eq!(store.get(&sha).await.expect("get"), data);
    assert!(store.exists(&sha).await.expect("exists"));
    assert_eq!(
        store.put(data.clone()).await.expect("put again"),
        (sha.clone(), Stored::Existing),
        "the same bytes give the same key"
    );
    assert_eq!(store.get(&sha).await.expect("get"), data);
    let listed: Vec<_> = store
        .list()
        .await
        .expect("list")
        .into_iter()
        .filter(|b| b.sha256 == sha)
        .collect();
    assert_eq!(listed.len(), 1, "one copy: {listed:?}");
    assert_eq!(listed[0].size, data.len() as u64);
}

async fn missing_and_invalid_keys(store: &dyn BlobStore) {
    assert!(matches!(store.get(EMPTY_SHA).await, Err(BlobError::NotFound(k)) if k == EMPTY_SHA));
    assert!(!store.exists(EMPTY_SHA).await.expect("exists"));
    assert_eq!(
        store
            .remove_if_unused_since(EMPTY_SHA, SystemTime::now() + Duration::from_secs(3600))
            .await
            .expect("remove"),
        None
    );
    for bad in [
        "",
        "../../etc/passwd",
        &EMPTY_SHA.to_uppercase(),
        &EMPTY_SHA[1..],
    ] {
        assert!(
            matches!(store.get(bad).await, Err(BlobError::InvalidKey(_))),
            "{bad}"
        );
        assert!(
            matches!(store.exists(bad).await, Err(BlobError::InvalidKey(_))),
            "{bad}"
        );
    }
}

async fn corrupt_blobs(store: &dyn BlobStore, tamper: Tamper<'_>) {
    let data = Bytes::from(vec![42u8; 300_017]);
    let (sha, _) = store.put(data.clone()).await.expect("put");
    // Same size, one byte changed: only the hash can tell.
    let mut bad = data.to_vec();
    bad[1000] ^= 1;
    tamper(sha.clone(), bad.clone()).await;
    match store.get(&sha).await {
        Err(BlobError::Corrupt { sha256, actual }) => {
            assert_eq!(sha256, sha);
            assert_eq!(actual, sha256_hex(&bad));
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(!store.exists(&sha).await.expect("exists"), "removed");
    assert!(matches!(store.get(&sha).await, Err(BlobError::NotFound(_))));
    assert_eq!(
        store.put(data.clone()).await.expect("put"),
        (sha.clone(), Stored::New)
    );
    assert_eq!(store.get(&sha).await.expect("get"), data);

    // A changed copy nobody read yet is replaced by the next put.
    for junk in [b"random junk".to_vec(), bad] {
        tamper(sha.clone(), junk).await;
        assert_eq!(
            store.put(data.clone()).await.expect("put"),
            (sha.clone(), Stored::Repaired)
        );
        assert_eq!(store.get(&sha).await.expect("get"), data);
    }
}

async fn listing_and_removal(store: &dyn BlobStore) {
    let (a, _) = store.put(Bytes::from_static(b"aaaa")).await.expect("put");
    let (b, _) = store.put(Bytes::from_static(b"bbbbbb")).await.expect("put");
    let listed = store.list().await.expect("list");
    let modified_of = |listed: &[crate::BlobInfo], sha: &str| {
        listed
            .iter()
            .find(|i| i.sha256 == sha)
            .map(|i| (i.size, i.modified))
    };
    let (size_a, modified_a) = modified_of(&listed, &a).expect("a listed");
    assert_eq!(size_a, 4);
    assert_eq!(modified_of(&listed, &b).map(|m| m.0), Some(6));

    // Written at or after the cutoff: kept.
    assert_eq!(
        store
            .remove_if_unused_since(&a, modified_a)
            .await
            .expect("remove"),
        None
    );
    assert!(store.exists(&a).await.expect("exists"));
    // Last stored before the cutoff: removed, its size reported, once.
    let later = SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(
        store
            .remove_if_unused_since(&b, later)
            .await
            .expect("remove"),
        Some(6)
    );
    assert_eq!(
        store
            .remove_if_unused_since(&b, later)
            .await
            .expect("remove"),
        None
    );
    assert!(matches!(store.get(&b).await, Err(BlobError::NotFound(_))));
    assert!(modified_of(&store.list().await.expect("list"), &b).is_none());

    // Storing `a` again renews it: what the collector reads as "last used" moves
    // forward (S3 keeps whole seconds, so this waits for the clock to tick).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert_eq!(
            store.put(Bytes::from_static(b"aaaa")).await.expect("put").1,
            Stored::Existing
        );
        let (_, now_a) = modified_of(&store.list().await.expect("list"), &a).expect("a listed");
        if now_a > modified_a {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a put of stored bytes never renewed them"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        store
            .remove_if_unused_since(&a, modified_a + Duration::from_millis(1))
            .await
            .expect("remove"),
        None,
        "renewed after the cutoff"
    );
    assert_eq!(
        store.get(&a).await.expect("get"),
        Bytes::from_static(b"aaaa")
    );
}
