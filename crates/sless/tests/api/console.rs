//! The web console's sessions: a token traded for an `HttpOnly; SameSite=Strict` cookie
//! that the API takes as it takes the token, with a CSRF header on every change.

use axum::http::Method;
use serde_json::json;

use crate::harness::{App, Req};

const SESSION: &str = "/v1/console/session";

fn sign_in(token: &str) -> Req {
    Req::json(Method::POST, SESSION, &json!({ "token": token })).token(None)
}

fn with_cookie(req: Req, cookie: &str) -> Req {
    req.token(None).header("cookie", cookie)
}

#[tokio::test]
async fn a_session_acts_as_its_token_and_changes_need_the_csrf_header() {
    let app = App::start().await;
    app.function("default", "hello").await;
    let ns_token = app.namespace_token("team-a").await;

    // A wrong token gets no session.
    app.expect_error(
        sign_in("not-a-token-at-all"),
        401,
        "unauthorized",
        &["unknown token"],
    )
    .await;
    app.expect_error(
        Req::json(Method::POST, SESSION, &json!({"tok": "x"})).token(None),
        400,
        "invalid",
        &["token"],
    )
    .await;

    let (status, headers, body) = app.send_full(sign_in(&ns_token)).await;
    assert_eq!(status.as_u16(), 201, "{body}");
    let set = headers["set-cookie"].to_str().unwrap().to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/v1"] {
        assert!(set.contains(attr), "{set}");
    }
    let cookie = set.split(';').next().unwrap().to_string();
    let csrf = body["csrf"].as_str().unwrap().to_string();

    // The cookie is the namespace token: its namespace only, others are 404.
    let who = app
        .expect(with_cookie(Req::get("/v1/whoami"), &cookie), 200)
        .await;
    assert_eq!(who["namespaces"], json!(["team-a"]));
    app.expect(
        with_cookie(Req::get("/v1/namespaces/default/functions/hello"), &cookie),
        404,
    )
    .await;
    let again = app
        .expect(with_cookie(Req::get(SESSION), &cookie), 200)
        .await;
    assert_eq!(again["csrf"], csrf.as_str());

    // A change without the session's CSRF token is refused; with it, it goes through.
    let put = || {
        Req::json(
            Method::PUT,
            "/v1/namespaces/team-a/secrets/db",
            &json!({"data": {"K": "v"}}),
        )
    };
    app.expect_error(
        with_cookie(put(), &cookie),
        403,
        "forbidden",
        &["x-sless-csrf"],
    )
    .await;
    app.expect_error(
        with_cookie(put(), &cookie).header("x-sless-csrf", "guess"),
        403,
        "forbidden",
        &["x-sless-csrf"],
    )
    .await;
    app.expect(
        with_cookie(put(), &cookie).header("x-sless-csrf", &csrf),
        201,
    )
    .await;

    // Signing out ends the session.
    app.expect(
        with_cookie(Req::delete(SESSION), &cookie).header("x-sless-csrf", &csrf),
        204,
    )
    .await;
    app.expect_error(
        with_cookie(Req::get("/v1/whoami"), &cookie),
        401,
        "unauthorized",
        &["sign in again"],
    )
    .await;
    let gone = app
        .expect(with_cookie(Req::get(SESSION), &cookie), 200)
        .await;
    assert_eq!(gone["csrf"], serde_json::Value::Null);
}

#[tokio::test]
async fn a_revoked_token_ends_its_sessions() {
    let app = App::start().await;
    let ns_token = app.namespace_token("team-a").await;
    let (_, headers, _) = app.send_full(sign_in(&ns_token)).await;
    let cookie = headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    app.expect(with_cookie(Req::get("/v1/whoami"), &cookie), 200)
        .await;
    let tokens = app.expect(Req::get("/v1/tokens"), 200).await;
    let id = tokens["items"][0]["id"].as_str().unwrap().to_string();
    app.expect(Req::delete(&format!("/v1/tokens/{id}")), 204)
        .await;
    app.expect(with_cookie(Req::get("/v1/whoami"), &cookie), 401)
        .await;
}

#[tokio::test]
async fn the_console_page_is_served_with_a_strict_policy() {
    let app = App::start().await;
    let (status, headers, body) = app.send_full(Req::get("/console").token(None)).await;
    assert_eq!(status.as_u16(), 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(body.as_str().unwrap().contains("/console/assets/app.js"));
    let (status, headers, _) = app
        .send_full(Req::get("/console/assets/app.js").token(None))
        .await;
    assert_eq!(status.as_u16(), 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    app.expect_error(
        Req::get("/console/assets/nope.js").token(None),
        404,
        "not_found",
        &["nope.js"],
    )
    .await;
}
