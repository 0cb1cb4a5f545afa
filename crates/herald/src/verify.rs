//! `herald verify`: check a webhook's signature from the command line (handy when debugging a receiver).

use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use herald_signature::{HmacSecret, Verifier, VerifyKey};

/// Arguments of `herald verify`.
#[derive(Args)]
pub(crate) struct VerifyArgs {
    /// The endpoint secret (whsec_…).
    #[arg(long, env = "HERALD_VERIFY_SECRET", hide_env_values = true)]
    secret: String,
    /// The webhook-id header.
    #[arg(long)]
    id: String,
    /// The webhook-timestamp header.
    #[arg(long)]
    timestamp: String,
    /// The webhook-signature header.
    #[arg(long)]
    signature: String,
    /// File holding the exact body bytes ('-' for standard input).
    #[arg(long)]
    body: PathBuf,
    /// Skip the timestamp tolerance check (for recorded requests).
    #[arg(long)]
    ignore_timestamp: bool,
}

/// The key sizes Standard Webhooks secrets have.
const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// The endpoint secret, or a plain error saying what is wrong with it and what it should look like.
fn secret(text: &str) -> anyhow::Result<HmacSecret> {
    const FORM: &str = "expected whsec_ followed by the base64 of 24 to 64 bytes, as \
                        GET /api/v1/app/{app_id}/endpoint/{endpoint_id}/secret shows it";
    let text = text.trim();
    if !text.starts_with("whsec_") && text.contains('_') {
        bail!("--secret is malformed (an unknown prefix): {FORM}");
    }
    let secret = HmacSecret::parse(text).map_err(|e| anyhow!("--secret is malformed ({e}): {FORM}"))?;
    if !KEY_BYTES.contains(&secret.len()) {
        bail!("--secret is malformed (its key is {} bytes): {FORM}", secret.len());
    }
    Ok(secret)
}

pub(crate) fn run(args: VerifyArgs, json: bool) -> anyhow::Result<()> {
    let secret = secret(&args.secret)?;
    let body = if args.body.as_os_str() == "-" {
        let mut buffer = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buffer).context("reading standard input")?;
        buffer
    } else {
        std::fs::read(&args.body).with_context(|| format!("reading {}", args.body.display()))?
    };
    let verifier = Verifier::new(vec![VerifyKey::from(secret)]);
    let result = if args.ignore_timestamp {
        verifier.verify_ignoring_timestamp(&args.id, &args.timestamp, &args.signature, &body)
    } else {
        verifier.verify_now(&args.id, &args.timestamp, &args.signature, &body)
    };
    result.map_err(|e| anyhow!("signature rejected: {e}"))?;
    if json {
        println!("{}", serde_json::json!({ "valid": true }));
    } else {
        println!("signature valid");
    }
    Ok(())
}
