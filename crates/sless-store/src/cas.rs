//! The retry rule shared by every compare-and-swap update of the store.
//!
//! An update reads the object (at generation `g`), computes the new value and writes it
//! with `... WHERE generation = g`. When no row matched, someone else changed the object
//! in between: the update reads it again and recomputes, so no writer's edit is lost and
//! no lock is held while the change is computed.

use std::time::Duration;

use sless_core::Backoff;

use crate::{Result, StoreError};

/// Attempts of one update before it gives up with [`StoreError::Contended`]. Every lost
/// attempt means another writer succeeded, so this bounds only pathological contention.
pub(crate) const MAX_ATTEMPTS: u32 = 64;

/// Pause between attempts, jittered so that writers that lost together do not meet again.
const RETRY: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));

/// One update's compare-and-swap loop state.
pub(crate) struct Cas<'a> {
    kind: &'static str,
    name: &'a str,
    expect: Option<u64>,
    attempt: u32,
}

impl<'a> Cas<'a> {
    /// An update of the `kind` object `name`; `expect` is the generation the caller
    /// last saw (`If-Match`), or `None` to apply the change to whatever is current.
    pub(crate) fn new(kind: &'static str, name: &'a str, expect: Option<u64>) -> Self {
        Self {
            kind,
            name,
            expect,
            attempt: 0,
        }
    }

    /// Fails with [`StoreError::PreconditionFailed`] when the caller expected another
    /// generation than the `current` one.
    pub(crate) fn check(&self, current: u64) -> Result<()> {
        match self.expect {
            Some(expected) if expected != current => Err(StoreError::PreconditionFailed {
                kind: self.kind,
                name: self.name.to_string(),
                current,
            }),
            _ => Ok(()),
        }
    }

    /// The write found the object changed: wait a little before reading it again, or
    /// give up after [`MAX_ATTEMPTS`]. With an expected generation nothing is retried:
    /// the next read fails [`Cas::check`] at once.
    pub(crate) async fn lost(&mut self) -> Result<()> {
        self.attempt += 1;
        if self.expect.is_some() {
            return Ok(());
        }
        if self.attempt >= MAX_ATTEMPTS {
            return Err(StoreError::Contended {
                kind: self.kind,
                name: self.name.to_string(),
            });
        }
        tokio::time::sleep(RETRY.jittered(self.attempt, rand::random::<f64>())).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::Utc;
    use serde_json::{Value, json};

    use super::*;
    use crate::{
        FunctionChange, FunctionRecord, JobRecord, JobStore, SqlStore, Store, TriggerRecord,
        TriggerStore,
    };

    const TASKS: usize = 20;

    /// A store in a file (WAL, a pool of connections), as the server runs it.
    async fn file_store() -> (tempfile::TempDir, Arc<SqlStore>) {
        let (dir, store) = crate::testing::pooled_store().await;
        store.ensure_namespace("ns").await.unwrap();
        (dir, Arc::new(store))
    }

    async fn create_all(store: &SqlStore) {
        let now = Utc::now();
        let mut spec: sless_core::FunctionSpec =
            serde_json::from_value(json!({"runtime": "python3"})).unwrap();
        spec.validate().unwrap();
        store
            .create_function(&FunctionRecord {
                namespace: "ns".into(),
                name: "f".into(),
                spec,
                status: Default::default(),
                revision: 1,
                code_sha256: None,
                // Ignored: a new object is at generation 1.
                generation: 7,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
        store
            .create_trigger(&TriggerRecord {
                namespace: "ns".into(),
                name: "t".into(),
                spec: serde_json::from_value(
                    json!({"function": "f", "type": "cron", "schedule": "* * * * *"}),
                )
                .unwrap(),
                status: Default::default(),
                generation: 7,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
        store
            .create_job(&JobRecord {
                namespace: "ns".into(),
                name: "j".into(),
                spec: serde_json::from_value(json!({"function": "f"})).unwrap(),
                status: Default::default(),
                code_sha256: None,
                generation: 7,
                created_at: now,
                updated_at: now,
            })
            .await
            .unwrap();
    }

    /// The edits of triggers and jobs as the API makes them: a merge patch of the spec.
    fn patch<T: serde::Serialize + serde::de::DeserializeOwned>(
        spec: &mut T,
        patch: &Value,
        allowed: &[&str],
    ) -> Result<()> {
        *spec = sless_core::patch::apply(spec, patch, allowed)?;
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_patches_of_each_kind_lose_nothing() {
        let (_dir, store) = file_store().await;
        create_all(&store).await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..TASKS {
            let store = store.clone();
            tasks.spawn(async move {
                let env = json!({"env": {format!("K{i}"): "v"}});
                store
                    .update_function("ns", "f", None, FunctionChange::Patch(env.clone()))
                    .await?;
                store
                    .update_job("ns", "j", None, &mut |j| {
                        patch(&mut j.spec, &env, sless_core::job::JOB_FIELDS)
                    })
                    .await?;
                let event = json!({"event": {format!("k{i}"): i}});
                store
                    .update_trigger("ns", "t", None, &mut |t| {
                        patch(&mut t.spec, &event, sless_core::trigger::TRIGGER_FIELDS)
                    })
                    .await?;
                Ok::<_, StoreError>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap().unwrap();
        }
        let f = store.get_function("ns", "f").await.unwrap();
        assert_eq!(f.spec.env.len(), TASKS);
        assert_eq!(
            (f.generation, f.revision),
            (1 + TASKS as u64, 1 + TASKS as u64)
        );
        let j = store.get_job("ns", "j").await.unwrap();
        assert_eq!((j.spec.env.len(), j.generation), (TASKS, 1 + TASKS as u64));
        let t = store.get_trigger("ns", "t").await.unwrap();
        let sless_core::trigger::TriggerKind::Cron { event, .. } = &t.spec.kind else {
            panic!("the trigger is still a cron trigger: {:?}", t.spec.kind);
        };
        let event = event.as_object().unwrap();
        assert_eq!((event.len(), t.generation), (TASKS, 1 + TASKS as u64));
    }

    fn http_trigger(name: &str, path: &str) -> TriggerRecord {
        let now = Utc::now();
        TriggerRecord {
            namespace: "ns".into(),
            name: name.into(),
            spec: serde_json::from_value(json!({"function": "f", "type": "http", "path": path}))
                .unwrap(),
            status: Default::default(),
            generation: 1,
            created_at: now,
            updated_at: now,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_http_path_is_claimed_by_one_trigger_even_when_writers_race() {
        let (_dir, store) = file_store().await;
        create_all(&store).await;
        store
            .create_trigger(&http_trigger("a", "/a"))
            .await
            .unwrap();
        let taken = store.create_trigger(&http_trigger("b", "/a")).await;
        assert!(
            matches!(&taken, Err(StoreError::PathTaken { path, owner }) if path == "/a" && owner == "a"),
            "{taken:?}"
        );
        // Ten triggers race to move onto one free path: exactly one gets it.
        for i in 0..10 {
            store
                .create_trigger(&http_trigger(&format!("t{i}"), &format!("/t{i}")))
                .await
                .unwrap();
        }
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..10 {
            let store = store.clone();
            tasks.spawn(async move {
                store
                    .update_trigger("ns", &format!("t{i}"), None, &mut |t| {
                        patch(
                            &mut t.spec,
                            &json!({"path": "/shared"}),
                            sless_core::trigger::TRIGGER_FIELDS,
                        )
                    })
                    .await
            });
        }
        let (mut won, mut refused) = (0, 0);
        while let Some(done) = tasks.join_next().await {
            match done.unwrap() {
                Ok(_) => won += 1,
                Err(StoreError::PathTaken { .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!((won, refused), (1, 9));
    }

    #[tokio::test]
    async fn an_expected_generation_applies_when_current_and_fails_when_stale() {
        let store = crate::testing::store().await;
        store.ensure_namespace("ns").await.unwrap();
        create_all(&store).await;
        let memory = |mb: u32| FunctionChange::Patch(json!({"memory_mb": mb}));

        let f = store
            .update_function("ns", "f", Some(1), memory(256))
            .await
            .unwrap();
        assert_eq!((f.generation, f.spec.memory_mb), (2, 256));
        let err = store
            .update_function("ns", "f", Some(1), memory(512))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::PreconditionFailed {
                    kind: "function",
                    current: 2,
                    ..
                }
            ),
            "{err}"
        );
        let f = store.get_function("ns", "f").await.unwrap();
        assert_eq!((f.generation, f.revision, f.spec.memory_mb), (2, 2, 256));

        let enable = |on: bool| {
            move |t: &mut TriggerRecord| {
                t.spec.enabled = on;
                Ok(())
            }
        };
        let t = store
            .update_trigger("ns", "t", Some(1), &mut enable(false))
            .await
            .unwrap();
        assert_eq!((t.generation, t.spec.enabled), (2, false));
        let err = store
            .update_trigger("ns", "t", Some(1), &mut enable(true))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::PreconditionFailed { current: 2, .. }),
            "{err}"
        );
        assert!(!store.get_trigger("ns", "t").await.unwrap().spec.enabled);

        let j = store.set_job_code("ns", "j", "aa", Some(1)).await.unwrap();
        assert_eq!((j.generation, j.code_sha256.as_deref()), (2, Some("aa")));
        let err = store
            .set_job_code("ns", "j", "bb", Some(1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::PreconditionFailed { current: 2, .. }),
            "{err}"
        );
        let j = store.get_job("ns", "j").await.unwrap();
        assert_eq!((j.generation, j.code_sha256.as_deref()), (2, Some("aa")));

        // A stale generation fails even when the change would change nothing.
        let err = store
            .update_function("ns", "f", Some(1), memory(256))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::PreconditionFailed { current: 2, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_change_that_changes_nothing_keeps_the_generation() {
        let store = crate::testing::store().await;
        store.ensure_namespace("ns").await.unwrap();
        create_all(&store).await;
        let before = store.get_function("ns", "f").await.unwrap();
        let f = store
            .update_function(
                "ns",
                "f",
                Some(1),
                FunctionChange::Patch(json!({"memory_mb": 128})),
            )
            .await
            .unwrap();
        assert_eq!(
            (f.generation, f.revision, f.updated_at),
            (1, 1, before.updated_at)
        );
        let f = store
            .update_function("ns", "f", None, FunctionChange::Spec(before.spec.clone()))
            .await
            .unwrap();
        assert_eq!(f.generation, 1);

        let t = store
            .update_trigger("ns", "t", None, &mut |_| Ok(()))
            .await
            .unwrap();
        assert_eq!(t.generation, 1);

        store.set_job_code("ns", "j", "aa", None).await.unwrap();
        let j = store.set_job_code("ns", "j", "aa", None).await.unwrap();
        assert_eq!(j.generation, 2);
        // An edit of the status alone is not a change of the job.
        let j = store
            .update_job("ns", "j", None, &mut |j| {
                j.status.message = "edited".into();
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(j.generation, 2);
        assert_eq!(store.get_job("ns", "j").await.unwrap().status.message, "");
    }

    #[tokio::test]
    async fn status_writes_leave_the_generation_alone() {
        let store = crate::testing::store().await;
        store.ensure_namespace("ns").await.unwrap();
        create_all(&store).await;
        let status = sless_core::FunctionStatus {
            message: "ready".into(),
            ..Default::default()
        };
        assert!(store.set_status("ns", "f", 1, &status).await.unwrap());
        store
            .set_trigger_status(
                "ns",
                "t",
                &sless_core::TriggerStatus {
                    last_result: Some(sless_core::trigger::TriggerResult::parse("ok")),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let job = sless_core::JobStatus {
            run_id: 1,
            message: "running".into(),
            ..Default::default()
        };
        assert!(store.set_job_status("ns", "j", &job).await.unwrap());
        let f = store.get_function("ns", "f").await.unwrap();
        let t = store.get_trigger("ns", "t").await.unwrap();
        let j = store.get_job("ns", "j").await.unwrap();
        assert_eq!((f.status.message.as_str(), f.generation), ("ready", 1));
        assert_eq!(
            (t.status.last_result.map(|r| r.to_string()), t.generation),
            (Some("ok".to_string()), 1)
        );
        assert_eq!((j.status.message.as_str(), j.generation), ("running", 1));

        // A change of the spec alone keeps the status the runner wrote.
        let j = store
            .update_job("ns", "j", None, &mut |j| {
                patch(
                    &mut j.spec,
                    &json!({"memory_mb": 256}),
                    sless_core::job::JOB_FIELDS,
                )
            })
            .await
            .unwrap();
        assert_eq!(j.generation, 2);
        let j = store.get_job("ns", "j").await.unwrap();
        assert_eq!(j.status.message, "running");
    }

    #[tokio::test]
    async fn a_refused_edit_writes_nothing_and_its_error_comes_back() {
        let store = crate::testing::store().await;
        store.ensure_namespace("ns").await.unwrap();
        create_all(&store).await;
        let err = store
            .update_trigger("ns", "t", None, &mut |t| {
                t.spec.enabled = false;
                Err(StoreError::Rejected("path is taken".into()))
            })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "path is taken");
        let err = store
            .update_job("ns", "j", None, &mut |j| {
                patch(
                    &mut j.spec,
                    &json!({"memory_mb": "lots"}),
                    sless_core::job::JOB_FIELDS,
                )
            })
            .await
            .unwrap_err();
        assert!(
            err.to_string().starts_with("memory_mb: invalid type"),
            "{err}"
        );
        let err = store
            .update_trigger("ns", "nope", None, &mut |_| Ok(()))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::NotFound {
                    kind: "trigger",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(store.get_trigger("ns", "t").await.unwrap().generation, 1);
        assert_eq!(store.get_job("ns", "j").await.unwrap().generation, 1);
    }

    #[tokio::test]
    async fn lost_races_back_off_then_give_up_and_expected_ones_do_not_wait() {
        tokio::time::pause();
        let mut cas = Cas::new("job", "j", None);
        let start = tokio::time::Instant::now();
        for _ in 1..MAX_ATTEMPTS {
            cas.lost().await.unwrap();
        }
        assert!(start.elapsed() > Duration::from_millis(50));
        let err = cas.lost().await.unwrap_err();
        assert!(
            matches!(err, StoreError::Contended { kind: "job", .. }),
            "{err}"
        );

        let mut cas = Cas::new("job", "j", Some(3));
        let start = tokio::time::Instant::now();
        cas.lost().await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(matches!(
            cas.check(4),
            Err(StoreError::PreconditionFailed { current: 4, .. })
        ));
        assert!(cas.check(3).is_ok());
    }

    #[tokio::test]
    async fn objects_made_before_the_generation_existed_are_at_generation_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sless.db");
        {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            sqlx::migrate!("./migrations")
                .run_to(5, &pool)
                .await
                .unwrap();
            let spec = json!({"runtime": "python3", "entrypoint": "handler.handle"}).to_string();
            let trigger =
                json!({"function": "f", "type": "cron", "schedule": "* * * * *"}).to_string();
            let now = crate::stamp(Utc::now());
            let status = |s: Result<String, serde_json::Error>| s.unwrap();
            let rows: [(&str, Vec<String>); 4] = [
                ("INSERT INTO namespaces VALUES ('ns', ?)", vec![now.clone()]),
                (
                    "INSERT INTO functions VALUES ('ns', 'f', ?, ?, 3, NULL, ?, ?)",
                    vec![
                        spec,
                        status(serde_json::to_string(&sless_core::FunctionStatus::default())),
                        now.clone(),
                        now.clone(),
                    ],
                ),
                (
                    "INSERT INTO triggers VALUES ('ns', 't', 'f', 'cron', ?, ?, ?, ?)",
                    vec![
                        trigger,
                        status(serde_json::to_string(&sless_core::TriggerStatus::default())),
                        now.clone(),
                        now.clone(),
                    ],
                ),
                (
                    "INSERT INTO jobs VALUES ('ns', 'j', '{\"function\": \"f\"}', ?, NULL, ?, ?)",
                    vec![
                        status(serde_json::to_string(&sless_core::JobStatus::default())),
                        now.clone(),
                        now,
                    ],
                ),
            ];
            for (sql, values) in rows {
                let mut query = sqlx::query(sql);
                for v in values {
                    query = query.bind(v);
                }
                query.execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
        let store = SqlStore::open(&path).await.unwrap();
        let f = store.get_function("ns", "f").await.unwrap();
        assert_eq!((f.generation, f.revision), (1, 3));
        assert_eq!(store.get_trigger("ns", "t").await.unwrap().generation, 1);
        assert_eq!(store.get_job("ns", "j").await.unwrap().generation, 1);
        let f = store
            .update_function("ns", "f", Some(1), FunctionChange::Code("aa".into()))
            .await
            .unwrap();
        assert_eq!((f.generation, f.revision), (2, 4));
    }
}
