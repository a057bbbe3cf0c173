//! The namespace trash: `DELETE /v1/namespaces/{ns}?force=true` hides the namespace
//! and everything in it, `POST /v1/namespaces/{ns}/restore` (admin only) brings it
//! back whole; a name taken again conflicts, and nothing of a trashed namespace is
//! listed or reachable meanwhile.

use axum::http::Method;
use serde_json::{Value, json};
use sless_store::TrashStore;

use crate::harness::{App, Req};

const NS: &str = "/v1/namespaces/team-a";

fn restore(ns: &str) -> Req {
    Req::new(Method::POST, &format!("/v1/namespaces/{ns}/restore"))
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str().map(str::to_string))
        .collect()
}

/// Namespace `team-a` with a quota, function `hello`, an HTTP trigger, a job that never
/// runs, a secret and a token; returns the token.
async fn team_a(app: &App) -> String {
    app.expect(
        Req::json(Method::PUT, NS, &json!({"quota": {"functions": 5}})),
        201,
    )
    .await;
    app.function("team-a", "hello").await;
    app.expect(
        Req::json(
            Method::POST,
            &format!("{NS}/triggers"),
            &json!({"name": "web", "function": "hello", "type": "http", "path": "/web"}),
        ),
        201,
    )
    .await;
    app.expect(
        Req::json(
            Method::POST,
            &format!("{NS}/jobs"),
            &json!({"name": "once", "function": "hello", "run_id": 0}),
        ),
        201,
    )
    .await;
    app.expect(
        Req::json(
            Method::PUT,
            &format!("{NS}/secrets/db"),
            &json!({"data": {"PASSWORD": "hunter2"}}),
        ),
        201,
    )
    .await;
    app.namespace_token("team-a").await
}

/// The objects `team_a` made answer as they did.
async fn team_a_is_whole(app: &App, token: &str) {
    for path in [
        format!("{NS}/functions/hello"),
        format!("{NS}/triggers/web"),
        format!("{NS}/jobs/once"),
    ] {
        app.expect(Req::get(&path), 200).await;
    }
    let secret = app.expect(Req::get(&format!("{NS}/secrets/db")), 200).await;
    assert_eq!(secret["keys"], json!(["PASSWORD"]), "{secret}");
    let me = app
        .expect(Req::get("/v1/whoami").token(Some(token)), 200)
        .await;
    assert_eq!(me["namespaces"], json!(["team-a"]), "{me}");
    let detail = app.expect(Req::get(NS), 200).await;
    assert_eq!(detail["quota"]["functions"], 5, "{detail}");
    assert_eq!(detail["usage"]["functions"], 1, "{detail}");
}

#[tokio::test]
async fn a_force_deleted_namespace_is_gone_until_it_is_restored_whole() {
    let app = App::start().await;
    let token = team_a(&app).await;
    let created = app.expect(Req::get(NS), 200).await["created_at"].clone();
    team_a_is_whole(&app, &token).await;

    app.expect(Req::delete(&format!("{NS}?force=true")), 204)
        .await;

    // Gone from every listing and every path.
    app.expect_error(Req::get(NS), 404, "not_found", &["team-a"])
        .await;
    for path in [
        format!("{NS}/functions"),
        format!("{NS}/functions/hello"),
        format!("{NS}/triggers/web"),
        format!("{NS}/jobs/once"),
        format!("{NS}/secrets/db"),
    ] {
        app.expect_error(Req::get(&path), 404, "not_found", &[])
            .await;
    }
    let list = app.expect(Req::get("/v1/namespaces"), 200).await;
    assert_eq!(names(&list), ["default"], "{list}");
    let me = app.expect(Req::get("/v1/whoami"), 200).await;
    assert_eq!(me["namespaces"], json!(["default"]), "{me}");
    let tokens = app.expect(Req::get("/v1/tokens"), 200).await;
    assert!(
        tokens["items"].as_array().unwrap().is_empty(),
        "a trashed namespace's token is listed: {tokens}"
    );
    // Its token no longer authenticates.
    app.expect_error(
        Req::get("/v1/whoami").token(Some(&token)),
        401,
        "unauthorized",
        &["token"],
    )
    .await;
    // The /t/ route of its trigger is gone.
    let (status, _) = app.send(Req::get("/t/team-a/web").token(None)).await;
    assert_eq!(status.as_u16(), 404);
    // Not even the admin reaches the name it is hidden under.
    let store = app.open_store().await;
    let trash = store.trashed_namespaces().await.unwrap();
    assert_eq!(trash.len(), 1);
    let hidden = &trash[0].hidden;
    for path in [
        format!("/v1/namespaces/{hidden}"),
        format!("/v1/namespaces/{hidden}/functions"),
        format!("/v1/namespaces/{hidden}/secrets/db"),
    ] {
        app.expect_error(Req::get(&path), 404, "not_found", &[])
            .await;
    }
    app.expect_error(restore(hidden), 404, "not_found", &[])
        .await;

    // Only the admin restores: to anyone else the endpoint does not exist.
    let other = app.namespace_token("default").await;
    app.expect_error(restore("team-a").token(Some(&other)), 404, "not_found", &[])
        .await;
    app.expect_error(
        restore("team-a").token(None),
        401,
        "unauthorized",
        &["Authorization"],
    )
    .await;
    app.expect_error(restore("never"), 404, "not_found", &["never", "trash"])
        .await;

    let restored = app.expect(restore("team-a"), 200).await;
    assert_eq!(restored["name"], "team-a", "{restored}");
    assert_eq!(restored["created_at"], created, "{restored}");
    assert_eq!(restored["quota"]["functions"], 5, "{restored}");
    assert_eq!(restored["usage"]["functions"], 1, "{restored}");
    // The same body a read answers.
    let mut read = app.expect(Req::get(NS), 200).await;
    read["usage"] = restored["usage"].clone();
    assert_eq!(read, restored);
    team_a_is_whole(&app, &token).await;
    let list = app.expect(Req::get("/v1/namespaces"), 200).await;
    assert_eq!(names(&list), ["default", "team-a"], "{list}");
    assert!(store.trashed_namespaces().await.unwrap().is_empty());
    let audit = app
        .expect(Req::get("/v1/audit?namespace=team-a&limit=1"), 200)
        .await;
    assert_eq!(audit["items"][0]["action"], "namespace.restore", "{audit}");
    assert_eq!(audit["items"][0]["status"], 200, "{audit}");
    // It is out of the trash now.
    app.expect_error(restore("team-a"), 404, "not_found", &["team-a", "trash"])
        .await;
}

#[tokio::test]
async fn a_name_in_use_again_conflicts_and_the_newest_delete_comes_back() {
    let app = App::start().await;
    team_a(&app).await;
    app.expect(Req::delete(&format!("{NS}?force=true")), 204)
        .await;
    // The name is free again; a new namespace of it blocks the restore.
    app.expect(Req::new(Method::PUT, NS), 201).await;
    app.expect_error(
        restore("team-a"),
        409,
        "conflict",
        &["team-a", "exists again"],
    )
    .await;
    // The refused restore changed nothing: the new namespace is empty.
    let list = app.expect(Req::get(&format!("{NS}/functions")), 200).await;
    assert!(names(&list).is_empty(), "{list}");
    // The new one, with a function of its own, is deleted as well: the newest comes back.
    app.function("team-a", "second").await;
    app.expect(Req::delete(&format!("{NS}?force=true")), 204)
        .await;
    app.expect(restore("team-a"), 200).await;
    let list = app.expect(Req::get(&format!("{NS}/functions")), 200).await;
    assert_eq!(names(&list), ["second"], "{list}");
    // Emptied and deleted without force (for good, not to the trash), the older one
    // is next.
    app.expect(Req::delete(&format!("{NS}/functions/second")), 204)
        .await;
    app.expect(Req::delete(NS), 204).await;
    app.expect(restore("team-a"), 200).await;
    let list = app.expect(Req::get(&format!("{NS}/functions")), 200).await;
    assert_eq!(names(&list), ["hello"], "{list}");
}

#[tokio::test]
async fn without_force_nothing_goes_to_the_trash() {
    let app = App::start().await;
    app.expect(Req::new(Method::PUT, NS), 201).await;
    app.function("team-a", "hello").await;
    app.expect_error(Req::delete(NS), 409, "conflict", &["team-a", "force"])
        .await;
    // Nothing of that name is in the trash.
    app.expect_error(restore("team-a"), 404, "not_found", &["team-a", "trash"])
        .await;
    app.expect(Req::delete(&format!("{NS}/functions/hello")), 204)
        .await;
    // Empty: deleted for good.
    app.expect(Req::delete(NS), 204).await;
    app.expect_error(restore("team-a"), 404, "not_found", &["team-a", "trash"])
        .await;
}
