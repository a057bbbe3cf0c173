//! The Terraform provider end to end: the real `terraform` binary drives the freshly built
//! `terraform-provider-sless` (through `dev_overrides` in a CLI config file of the test's
//! own, with no registry reachable or asked) against a real `sless serve`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Server, TOKEN, repo_path};

/// `terraform` on this machine: `/usr/local/bin/terraform`, or the one on PATH.
fn terraform_bin() -> PathBuf {
    let local = PathBuf::from("/usr/local/bin/terraform");
    if local.exists() {
        local
    } else {
        PathBuf::from("terraform")
    }
}

/// A Terraform working directory bound to one server.
struct Tf {
    dir: tempfile::TempDir,
    server_url: String,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Tf {
    /// A working directory holding a copy of `examples/terraform` (or nothing).
    fn new(server: &Server, example: bool) -> Tf {
        let dir = tempfile::tempdir().expect("tempdir");
        if example {
            copy_dir(&repo_path("examples/terraform"), dir.path());
        }
        let provider_dir = Path::new(env!("CARGO_BIN_EXE_terraform-provider-sless"))
            .parent()
            .expect("bin dir")
            .to_path_buf();
        std::fs::write(
            dir.path().join(".terraformrc"),
            format!(
                "provider_installation {{\n  dev_overrides {{\n    \"registry.terraform.io/sless/sless\" = \"{}\"\n  }}\n  direct {{}}\n}}\n",
                provider_dir.display()
            ),
        )
        .expect("cli config");
        Tf {
            dir,
            server_url: server.url(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
    }

    async fn run(&self, args: &[&str]) -> Run {
        let out = tokio::process::Command::new(terraform_bin())
            .args(args)
            .current_dir(self.path())
            .env("TF_CLI_CONFIG_FILE", self.path().join(".terraformrc"))
            .env("TF_DATA_DIR", self.path().join(".terraform"))
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env("SLESS_SERVER", &self.server_url)
            .env("SLESS_TOKEN", TOKEN)
            .env_remove("SLESS_NAMESPACE")
            // As many users have it set: errors must still read as messages, not stacks.
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(300), out)
            .await
            .expect("terraform finishes within 300 s")
            .expect("run terraform");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs and requires success.
    async fn ok(&self, args: &[&str]) -> Run {
        let r = self.run(args).await;
        assert_eq!(
            r.code, 0,
            "terraform {args:?} failed:\n{}\n{}",
            r.stdout, r.stderr
        );
        r
    }

    async fn apply(&self, vars: &[&str]) -> Run {
        let mut args = vec!["apply", "-auto-approve", "-no-color"];
        args.extend(vars);
        self.ok(&args).await
    }

    /// `plan -detailed-exitcode`: 0 no changes, 2 changes.
    async fn plan_code(&self, vars: &[&str]) -> i32 {
        let mut args = vec!["plan", "-detailed-exitcode", "-no-color"];
        args.extend(vars);
        let r = self.run(&args).await;
        assert!(
            r.code == 0 || r.code == 2,
            "plan failed:\n{}\n{}",
            r.stdout,
            r.stderr
        );
        r.code
    }

    /// The planned resource changes: `(address, actions, changed attribute names)`.
    async fn plan_changes(&self, vars: &[&str]) -> Vec<(String, Vec<String>, BTreeSet<String>)> {
        let mut args = vec!["plan", "-out=tfplan", "-no-color"];
        args.extend(vars);
        self.ok(&args).await;
        let shown = self.ok(&["show", "-json", "tfplan"]).await;
        let plan: Value = serde_json::from_str(&shown.stdout).expect("plan JSON");
        let mut out = Vec::new();
        for rc in plan["resource_changes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let actions: Vec<String> = rc["change"]["actions"]
                .as_array()
                .expect("actions")
                .iter()
                .map(|a| a.as_str().expect("action").to_string())
                .collect();
            // Data sources read during a plan whose dependencies change are not changes.
            if actions == ["no-op"] || actions == ["read"] {
                continue;
            }
            let before = rc["change"]["before"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let after = rc["change"]["after"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let unknown = rc["change"]["after_unknown"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let keys: BTreeSet<String> = before.keys().chain(after.keys()).cloned().collect();
            let changed = keys
                .into_iter()
                .filter(|k| {
                    before.get(k) != after.get(k)
                        || unknown.get(k).is_some_and(|u| u != &Value::Bool(false))
                })
                .collect();
            out.push((
                rc["address"].as_str().expect("address").to_string(),
                actions,
                changed,
            ));
        }
        out
    }

    async fn output(&self, name: &str) -> String {
        self.ok(&["output", "-raw", "-no-color", name]).await.stdout
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in walkdir::WalkDir::new(from).min_depth(1) {
        let entry = entry.expect("walk");
        let rel = entry.path().strip_prefix(from).expect("relative");
        let target = to.join(rel);
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&target).expect("mkdir");
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

async fn http_get(url: &str) -> (u16, String) {
    let resp = reqwest::get(url).await.expect("GET");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// Polls `check` every 200 ms for up to `secs` seconds.
async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const FAST_TICK: &str = "-var=tick_schedule=* * * * * *";

#[tokio::test]
async fn the_example_applies_serves_fires_and_then_plans_no_changes() {
    let server = Server::start().await;
    let tf = Tf::new(&server, true);
    let started = Instant::now();
    let applied = tf.apply(&[FAST_TICK]).await;
    eprintln!(
        "terraform apply of the example took {:?}",
        started.elapsed()
    );
    assert!(
        applied.stdout.contains("Resources: 6 added"),
        "{}",
        applied.stdout
    );

    // The function answers over HTTP at the URL the state records.
    let url = tf.output("hello_url").await;
    assert_eq!(url, format!("{}/fn/shop/hello", server.url()));
    let (status, body) = http_get(&url).await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"message":"hello, world"}"#)
    );
    let (status, body) = http_get(&tf.output("api_url").await).await;
    assert_eq!(status, 200, "{body}");
    // The service keeps an instance running.
    let api = server
        .client
        .get_function("shop", "api")
        .await
        .expect("api");
    assert!(api.status.instances.ready >= 1, "{:?}", api.status);

    // The job ran with wait = true: its result is in the state.
    let result: Value = serde_json::from_str(&tf.output("warmup_result").await).expect("json");
    assert_eq!(result, serde_json::json!({"message": "hello, terraform"}));

    // The cron trigger fires (every second here).
    eventually(30, "the cron trigger fires", || async {
        let q = sless_client::InvocationQuery {
            function: Some("hello".into()),
            source: Some("cron".into()),
            ..Default::default()
        };
        !server
            .client
            .list_invocations("shop", &q)
            .await
            .expect("list")
            .is_empty()
    })
    .await;

    // A second plan right after apply changes nothing.
    assert_eq!(
        tf.plan_code(&[FAST_TICK]).await,
        0,
        "plan after apply has changes"
    );

    // A changed handler file is one in-place update of the code hash.
    let handler = tf.path().join("functions/hello/handler.py");
    let code = std::fs::read_to_string(&handler).expect("read");
    std::fs::write(&handler, code.replace("{name}\"", "{name}!\"")).expect("write");
    let changes = tf.plan_changes(&[FAST_TICK]).await;
    assert_eq!(changes.len(), 1, "{changes:?}");
    let (address, actions, changed) = &changes[0];
    assert_eq!(address, "sless_function.hello");
    assert_eq!(actions, &["update"]);
    assert!(changed.contains("code_sha256"), "{changed:?}");
    tf.apply(&[FAST_TICK]).await;
    let (status, body) = http_get(&url).await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"message":"hello, world!"}"#)
    );
    assert_eq!(tf.plan_code(&[FAST_TICK]).await, 0);

    // A function deleted outside Terraform (with the CLI) is planned for creation again.
    let rm = tokio::process::Command::new(env!("CARGO_BIN_EXE_sless"))
        .args(["rm", "--namespace", "shop", "hello"])
        .env("SLESS_SERVER", server.url())
        .env("SLESS_TOKEN", TOKEN)
        .output()
        .await
        .expect("sless rm");
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    let changes = tf.plan_changes(&[FAST_TICK]).await;
    let hello = changes
        .iter()
        .find(|(a, _, _)| a == "sless_function.hello")
        .expect("hello planned");
    assert_eq!(hello.1, ["create"], "{changes:?}");
    tf.apply(&[FAST_TICK]).await;
    assert_eq!(http_get(&url).await.0, 200);

    // Destroy removes everything.
    tf.ok(&["destroy", "-auto-approve", "-no-color", FAST_TICK])
        .await;
    for name in ["hello", "api"] {
        let err = server
            .client
            .get_function("shop", name)
            .await
            .expect_err("gone");
        assert_eq!(err.status(), Some(404));
    }
    let namespaces = server.client.list_namespaces().await.expect("list");
    assert!(
        namespaces.iter().all(|n| n.name != "shop"),
        "{namespaces:?}"
    );
    assert_eq!(http_get(&url).await.0, 404);
}

/// Every kind of resource, for the import test.
const ALL_KINDS: &str = r#"
terraform {
  required_providers {
    sless = { source = "sless/sless" }
  }
}
provider "sless" {
  namespace = "kinds"
}
resource "sless_namespace" "kinds" {
  name = "kinds"
}
resource "sless_secret" "db" {
  namespace = sless_namespace.kinds.name
  name      = "db"
  data      = { dsn = "postgres://example" }
}
resource "sless_function" "f" {
  namespace  = sless_namespace.kinds.name
  name       = "f"
  runtime    = "python3.11"
  source_dir = "${path.module}/f"
  env        = { MODE = "x" }
  secret_env = { DSN = "${sless_secret.db.name}/dsn" }
  timeout_sec = 5
}
resource "sless_service" "s" {
  name       = "s"
  runtime    = "nodejs"
  source_dir = "${path.module}/s"
  depends_on = [sless_namespace.kinds]
}
resource "sless_trigger" "web" {
  name     = "web"
  function = sless_function.f.name
  http {
    path    = "/orders"
    methods = ["GET", "POST"]
  }
}
resource "sless_trigger" "cron" {
  name     = "cron"
  function = sless_function.f.name
  enabled  = false
  cron {
    schedule = "0 3 * * *"
    timezone = "Europe/Paris"
    event    = jsonencode({ b = 2, a = 1 })
  }
}
resource "sless_trigger" "queue" {
  name     = "queue"
  function = sless_function.f.name
  queue {
    kind              = "nats"
    url               = "nats://127.0.0.1:1"
    topic             = "orders.>"
    dead_letter_topic = "orders.dlq"
  }
  delivery {
    max_attempts = 4
    ordering     = "key"
  }
}
resource "sless_trigger" "dev" {
  name     = "dev"
  function = sless_function.f.name
  device {
    devices = "t*"
  }
}
resource "sless_job" "once" {
  name     = "once"
  function = sless_function.f.name
  event    = jsonencode({ n = 1 })
}
resource "sless_job" "own" {
  name       = "own"
  runtime    = "python3"
  source_dir = "${path.module}/job"
  run_id     = 2
  wait       = true
  depends_on = [sless_namespace.kinds]
}
resource "sless_device" "t1" {
  name       = "t1"
  labels     = { room = "lab" }
  depends_on = [sless_namespace.kinds]
}
data "sless_function" "f" {
  name       = sless_function.f.name
}
data "sless_namespace" "kinds" {
  name       = sless_namespace.kinds.name
  depends_on = [sless_function.f, sless_service.s]
}
output "password" {
  value     = sless_device.t1.password
  sensitive = true
}
output "runtime" {
  value = data.sless_function.f.runtime
}
output "functions" {
  value = join(",", data.sless_namespace.kinds.functions)
}
output "own_result" {
  value = sless_job.own.result
}
"#;

fn write_all_kinds(tf: &Tf) {
    tf.write("main.tf", ALL_KINDS);
    tf.write(
        "f/handler.py",
        "import os\n\ndef handle(event):\n    return {'dsn': os.environ.get('DSN'), 'mode': os.environ.get('MODE')}\n",
    );
    tf.write("s/handler.js", "exports.handle = async () => 'up';\n");
    tf.write(
        "job/handler.py",
        "def handle(event):\n    return {'own': True}\n",
    );
}

/// The attributes that only the configuration holds (the server cannot report them), so
/// an import cannot know them; the secret's values are never read back either.
const UNREADABLE: &[&str] = &["source_dir", "source_zip", "wait", "force_destroy", "data"];

#[tokio::test]
async fn every_kind_applies_and_imports_into_an_empty_state_with_no_changes() {
    let server = Server::start_with(&["--mqtt-listen", "127.0.0.1:0"]).await;
    let tf = Tf::new(&server, false);
    write_all_kinds(&tf);
    tf.apply(&[]).await;
    assert_eq!(tf.plan_code(&[]).await, 0, "plan after apply has changes");
    assert_eq!(tf.output("runtime").await, "python3.11");
    assert_eq!(tf.output("functions").await, "f,s");
    assert_eq!(tf.output("own_result").await, r#"{"own":true}"#);
    let password = tf.output("password").await;
    assert!(password.len() >= 16, "a device password: {password:?}");
    // The secret reached the function.
    let (status, body) = http_get(&format!("{}/fn/kinds/f", server.url())).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("json"),
        serde_json::json!({"dsn": "postgres://example", "mode": "x"})
    );

    // The same configuration in an empty state, every object imported.
    let fresh = Tf::new(&server, false);
    write_all_kinds(&fresh);
    let imports = [
        ("sless_namespace.kinds", "kinds"),
        ("sless_secret.db", "kinds/db"),
        ("sless_function.f", "kinds/f"),
        ("sless_service.s", "kinds/s"),
        ("sless_trigger.web", "kinds/web"),
        ("sless_trigger.cron", "kinds/cron"),
        ("sless_trigger.queue", "kinds/queue"),
        ("sless_trigger.dev", "kinds/dev"),
        ("sless_job.once", "kinds/once"),
        ("sless_job.own", "own"),
        ("sless_device.t1", "kinds/t1"),
    ];
    for (address, id) in imports {
        fresh.ok(&["import", "-no-color", address, id]).await;
    }
    for (address, actions, changed) in fresh.plan_changes(&[]).await {
        assert_eq!(
            actions,
            ["update"],
            "{address} after import: {actions:?} {changed:?}"
        );
        let unexpected: Vec<&String> = changed
            .iter()
            .filter(|k| !UNREADABLE.contains(&k.as_str()))
            .collect();
        assert!(
            unexpected.is_empty(),
            "{address} after import changes {unexpected:?}"
        );
    }
    // Applying records those settings and changes nothing on the server.
    let before = server.client.get_function("kinds", "f").await.expect("f");
    fresh.apply(&[]).await;
    assert_eq!(fresh.plan_code(&[]).await, 0);
    let after = server.client.get_function("kinds", "f").await.expect("f");
    assert_eq!(before.status.revision, after.status.revision);

    // An import of something that does not exist is a clear error.
    let r = fresh
        .run(&[
            "import",
            "-no-color",
            "sless_function.missing",
            "kinds/nope",
        ])
        .await;
    assert_ne!(r.code, 0);

    fresh.ok(&["destroy", "-auto-approve", "-no-color"]).await;
    let namespaces = server.client.list_namespaces().await.expect("list");
    assert!(
        namespaces.iter().all(|n| n.name != "kinds"),
        "{namespaces:?}"
    );
}

#[tokio::test]
async fn a_failed_build_fails_the_apply_with_the_build_error_and_leaves_nothing() {
    let server = Server::start().await;
    let tf = Tf::new(&server, false);
    tf.write(
        "main.tf",
        r#"
terraform {
  required_providers {
    sless = { source = "sless/sless" }
  }
}
resource "sless_function" "broken" {
  name       = "broken"
  runtime    = "python3"
  source_dir = "${path.module}/code"
}
resource "sless_trigger" "route" {
  name     = "route"
  function = sless_function.broken.name
  http {
    path = "/broken"
  }
}
"#,
    );
    tf.write(
        "code/handler.py",
        "def something_else(event):\n    return 1\n",
    );
    let r = tf.run(&["apply", "-auto-approve", "-no-color"]).await;
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(
        r.stderr.contains("function default/broken failed"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("handle"),
        "the build error names the missing handler: {}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("tf_provider::"),
        "a stack in the error: {}",
        r.stderr
    );
    // Nothing is left behind on the server, and the trigger was never attempted.
    let err = server
        .client
        .get_function("default", "broken")
        .await
        .expect_err("gone");
    assert_eq!(err.status(), Some(404));

    tf.write(
        "code/handler.py",
        "def handle(event):\n    return 'fixed'\n",
    );
    tf.apply(&[]).await;
    let (status, body) = http_get(&format!("{}/t/default/broken", server.url())).await;
    assert_eq!((status, body.as_str()), (200, "fixed"));
    assert_eq!(tf.plan_code(&[]).await, 0);

    // A build failure on update keeps the old revision serving and fails the apply.
    tf.write("code/handler.py", "def nope(event):\n    return 1\n");
    let r = tf.run(&["apply", "-auto-approve", "-no-color"]).await;
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.stderr.contains("failed"), "{}", r.stderr);
    tf.write(
        "code/handler.py",
        "def handle(event):\n    return 'fixed again'\n",
    );
    tf.apply(&[]).await;
    let (status, body) = http_get(&format!("{}/fn/default/broken", server.url())).await;
    assert_eq!((status, body.as_str()), (200, "fixed again"));
}

const HEADER: &str = r#"
terraform {
  required_providers {
    sless = { source = "sless/sless" }
  }
}
"#;

#[tokio::test]
async fn bad_configuration_is_a_clear_error_and_creates_nothing() {
    let server = Server::start().await;
    let cases: &[(&str, &str, &str)] = &[
        (
            "two kinds in one trigger",
            r#"resource "sless_trigger" "t" {
  name     = "t"
  function = "f"
  http {
    path = "/x"
  }
  cron {
    schedule = "* * * * *"
  }
}"#,
            "exactly one of the http, cron, queue and device blocks",
        ),
        (
            "an event that is not JSON",
            r#"resource "sless_job" "j" {
  name     = "j"
  function = "f"
  event    = "{not json"
}"#,
            "event is not JSON",
        ),
        (
            "a service without instances",
            r#"resource "sless_service" "s" {
  name          = "s"
  runtime       = "python3"
  source_dir    = "${path.module}/code"
  min_instances = 0
}"#,
            "a service runs at least one instance",
        ),
        (
            "a folder that is not there",
            r#"resource "sless_function" "f" {
  name       = "f"
  runtime    = "python3"
  source_dir = "${path.module}/missing"
}"#,
            "source_dir",
        ),
        (
            "a function without code",
            r#"resource "sless_function" "f" {
  name    = "f"
  runtime = "python3"
}"#,
            "source_dir or source_zip is required",
        ),
        (
            "a secret reference that is not secret/key",
            r#"resource "sless_function" "f" {
  name       = "f"
  runtime    = "python3"
  source_dir = "${path.module}/code"
  secret_env = { DSN = "db" }
}"#,
            "is not of the form secret/key",
        ),
    ];
    for (what, config, needle) in cases {
        let tf = Tf::new(&server, false);
        tf.write("main.tf", &format!("{HEADER}{config}\n"));
        tf.write("code/handler.py", "def handle(event):\n    return 1\n");
        let r = tf.run(&["plan", "-no-color"]).await;
        assert_ne!(r.code, 0, "{what}: plan succeeded:\n{}", r.stdout);
        let said = r
            .stderr
            .replace('\n', " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            said.contains(needle),
            "{what}: {needle:?} not in: {}",
            r.stderr
        );
    }

    // What only the server can refuse fails the apply with the server's message.
    let tf = Tf::new(&server, false);
    tf.write(
        "main.tf",
        &format!(
            "{HEADER}{}",
            r#"resource "sless_function" "f" {
  name       = "Not_A_Label"
  runtime    = "python3"
  source_dir = "${path.module}/code"
}
"#
        ),
    );
    tf.write("code/handler.py", "def handle(event):\n    return 1\n");
    let r = tf.run(&["apply", "-auto-approve", "-no-color"]).await;
    assert_ne!(r.code, 0);
    assert!(
        r.stderr
            .contains("cannot create function default/Not_A_Label"),
        "{}",
        r.stderr
    );
    assert!(
        server
            .client
            .list_functions("default")
            .await
            .expect("list")
            .is_empty()
    );

    // A server that is not there is named.
    let tf = Tf {
        server_url: "http://127.0.0.1:1".into(),
        ..Tf::new(&server, false)
    };
    tf.write(
        "main.tf",
        &format!(
            "{HEADER}{}",
            r#"data "sless_namespace" "d" {
  name = "default"
}
"#
        ),
    );
    let r = tf.run(&["plan", "-no-color"]).await;
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("127.0.0.1:1"), "{}", r.stderr);
}
