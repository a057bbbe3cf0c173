//! `terraform-provider-sless`: the Terraform provider, started by Terraform itself (see
//! docs/terraform.md); it serves plugin protocol 6 on a loopback port and exits when
//! Terraform is done with it.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sless_terraform::serve().await
}
