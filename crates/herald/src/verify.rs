//! `herald verify`: check a webhook's signature from the command line (handy when debugging a receiver).

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;
use herald_signature::{HmacSecret, Verifier, VerifyKey};

/// Arguments of `herald verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The endpoint secret (`whsec_…`).
    #[arg(long, env = "HERALD_VERIFY_SECRET", hide_env_values = true)]
    secret: String,
    /// The `webhook-id` header.
    #[arg(long)]
    id: String,
    /// The `webhook-timestamp` header.
    #[arg(long)]
    timestamp: String,
    /// The `webhook-signature` header.
    #[arg(long)]
    signature: String,
    /// File holding the exact body bytes (`-` for standard input).
    #[arg(long)]
    body: PathBuf,
    /// Skip the timestamp tolerance check (for recorded requests).
    #[arg(long)]
    ignore_timestamp: bool,
}

pub fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let secret = HmacSecret::parse(&args.secret).map_err(|e| anyhow!("--secret: {e}"))?;
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
    println!("signature valid");
    Ok(())
}
