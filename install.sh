#!/usr/bin/env bash
# Sets up a fresh Debian machine for sless: installs the system packages it runs
# functions with (bubblewrap, slirp4netns and iproute2 for their network, Python,
# Node.js, npm; gcc and make for the Kafka connector's librdkafka; mosquitto for devices),
# builds the binary and puts it on PATH as /usr/local/bin/sless. Run as root (or with sudo).
set -euo pipefail
cd "$(dirname "$0")"

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v setpriv >/dev/null || need_apt+=(util-linux)
command -v slirp4netns >/dev/null || need_apt+=(slirp4netns)
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || [ -x /usr/bin/ip ] || [ -x /bin/ip ] || need_apt+=(iproute2)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
command -v zip >/dev/null || need_apt+=(zip)
# Go functions are built with Debian's Go toolchain (1.19 on Debian 12).
[ -x /usr/bin/go ] || need_apt+=(golang-go)
# The Kafka connector builds its bundled librdkafka with these.
command -v gcc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
command -v perl >/dev/null || need_apt+=(perl)
# The MQTT broker for devices (`sless serve --mqtt-listen`), with its dynamic-security
# plugin, and mosquitto_pub/_sub to try it.
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null || need_apt+=(mosquitto)
command -v mosquitto_pub >/dev/null || need_apt+=(mosquitto-clients)
# The Terraform provider compiles Terraform's plugin protocol with protoc.
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

echo "==> building sless"
cargo build --release --locked -p sless --features kafka
install -m 0755 target/release/sless /usr/local/bin/sless
# The Terraform provider (docs/terraform.md says how to point Terraform at it).
install -m 0755 target/release/terraform-provider-sless /usr/local/bin/terraform-provider-sless
echo "==> installed /usr/local/bin/sless and /usr/local/bin/terraform-provider-sless; start sless with: sless serve"
