//! `GET /openapi.json`: served without a token, and covering exactly the routes the
//! router registers, method by method.

use std::collections::BTreeSet;

use axum::http::{Method, StatusCode};

use crate::harness::{App, Req};

/// The document describes every route of the router with every method it takes,
/// and nothing else: each recorded path is probed with each method (no token:
/// a routed method answers 401 or 200, another one 405).
#[tokio::test]
async fn the_document_covers_every_route_and_method_of_the_router() {
    let app = App::start().await;
    let (status, doc) = app.send(Req::get("/openapi.json").token(None)).await;
    assert_eq!(status, StatusCode::OK, "{doc}");

    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                documented.insert((path.clone(), method.to_uppercase()));
            }
        }
    }

    let mut routed = BTreeSet::new();
    let paths = sless_api::routes().paths().to_vec();
    assert!(paths.len() > 10, "{paths:?}");
    for path in paths {
        let concrete = path
            .replace("{ns}", "probe-ns")
            .replace("{name}", "probe-name");
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ] {
            let (status, body) = app
                .send(Req::new(method.clone(), &concrete).token(None))
                .await;
            match status {
                StatusCode::METHOD_NOT_ALLOWED => {}
                StatusCode::OK | StatusCode::UNAUTHORIZED => {
                    routed.insert((path.to_string(), method.to_string()));
                }
                other => panic!("{method} {concrete}: unexpected {other} {body}"),
            }
        }
    }
    let missing: Vec<_> = routed.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "routes missing from /openapi.json (annotate them, see ARCHITECTURE.md): {missing:?}"
    );
    let extra: Vec<_> = documented.difference(&routed).collect();
    assert!(extra.is_empty(), "documented but not routed: {extra:?}");
}

/// Every `/v1` operation requires the bearer scheme; health and the document do not.
#[tokio::test]
async fn v1_operations_require_the_bearer_scheme() {
    let app = App::start().await;
    let (_, doc) = app.send(Req::get("/openapi.json").token(None)).await;
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["security"][0]["bearer"], serde_json::json!([]));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            let public = op["security"] == serde_json::json!([{}]);
            assert_eq!(public, !path.starts_with("/v1/"), "{method} {path}");
            if path.starts_with("/v1/") {
                let error = &op["responses"]["401"]["content"]["application/json"]["schema"];
                assert_eq!(
                    error["$ref"], "#/components/schemas/ErrorBody",
                    "{method} {path}"
                );
            }
        }
    }
}
