# A runnable sless configuration: a function, an always-on service, a cron trigger,
# a queue trigger and a job. See docs/terraform.md for installing the provider.
#
#   export SLESS_SERVER=http://127.0.0.1:8080 SLESS_TOKEN=$(cat ~/.local/share/sless/admin-token)
#   terraform apply

terraform {
  required_providers {
    sless = {
      source = "sless/sless"
    }
  }
}

# endpoint, token and namespace come from SLESS_SERVER, SLESS_TOKEN and SLESS_NAMESPACE
# when not set here.
provider "sless" {}

variable "namespace" {
  description = "The namespace everything below lives in."
  type        = string
  default     = "shop"
}

variable "tick_schedule" {
  description = "When the cron trigger fires (5 fields, or 6 with seconds first)."
  type        = string
  default     = "*/5 * * * *"
}

variable "broker_url" {
  description = "The MQTT broker the queue trigger reads orders from."
  type        = string
  default     = "mqtt://127.0.0.1:1883"
}

resource "sless_namespace" "shop" {
  name          = var.namespace
  force_destroy = true
}

# A Python function, served at /fn/shop/hello, scaled to zero when idle.
resource "sless_function" "hello" {
  namespace  = sless_namespace.shop.name
  name       = "hello"
  runtime    = "python3"
  source_dir = "${path.module}/functions/hello"
  env = {
    GREETING = "hello"
  }
  memory_mb   = 128
  timeout_sec = 10
}

# A Node.js service: always at least one instance running.
resource "sless_service" "api" {
  namespace     = sless_namespace.shop.name
  name          = "api"
  runtime       = "nodejs"
  source_dir    = "${path.module}/functions/api"
  max_instances = 4
}

# Calls hello on a schedule with a fixed event.
resource "sless_trigger" "tick" {
  namespace = sless_namespace.shop.name
  name      = "tick"
  function  = sless_function.hello.name
  cron {
    schedule = var.tick_schedule
    event    = jsonencode({ name = "cron" })
  }
}

# Every message on the broker's `orders` topic calls hello, retried up to 5 times.
# The broker may be down: the trigger connects when it can.
resource "sless_trigger" "orders" {
  namespace = sless_namespace.shop.name
  name      = "orders"
  function  = sless_function.hello.name
  queue {
    kind  = "mqtt"
    url   = var.broker_url
    topic = "orders"
  }
  delivery {
    max_attempts = 5
    concurrency  = 2
  }
}

# Runs hello once with an event; apply waits for the result.
resource "sless_job" "warmup" {
  namespace = sless_namespace.shop.name
  name      = "warmup"
  function  = sless_function.hello.name
  event     = jsonencode({ name = "terraform" })
  wait      = true
}

output "hello_url" {
  value = sless_function.hello.url
}

output "api_url" {
  value = sless_service.api.url
}

output "warmup_result" {
  value = sless_job.warmup.result
}
