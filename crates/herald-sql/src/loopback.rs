//! PostgreSQL connection options, and no TLS on loopback unless asked for.
//!
//! Like libpq, sqlx's default `sslmode` is `prefer`: it encrypts whenever the server offers TLS, as
//! Debian's and most packaged servers do. Over a loopback address that protects nothing — the bytes
//! never leave the host, and whoever could read them there could read the processes' memory too — but
//! it costs both ends an encryption and a decryption of every query and row, and a fan-out sends
//! thousands of rows (docs/performance.md has the figures). So when the URL names a loopback host
//! (`localhost`, `127.0.0.0/8`, `::1`) and neither the URL (`sslmode`, `ssl-mode`) nor the environment
//! (`PGSSLMODE`) chooses a mode, Herald connects without TLS. A mode given anywhere is kept as given;
//! every other host keeps sqlx's default.

use std::net::IpAddr;
use std::str::FromStr as _;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// The connection options of `url`, without TLS on a loopback host when no `sslmode` is chosen (see
/// the module's documentation).
///
/// # Errors
///
/// `url` is not a valid PostgreSQL connection URL.
pub fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    options_with(url, std::env::var_os("PGSSLMODE").is_some())
}

/// [`connect_options`], told whether the environment chooses a mode.
fn options_with(url: &str, mode_in_env: bool) -> Result<PgConnectOptions, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?;
    Ok(if !mode_in_env && plain_by_default(url) {
        options.ssl_mode(PgSslMode::Disable)
    } else {
        options
    })
}

/// Whether `url` names a loopback host over TCP and chooses no `sslmode` itself.
fn plain_by_default(url: &str) -> bool {
    let Ok(url) = url::Url::parse(url) else {
        return false;
    };
    let chooses_mode = url.query_pairs().any(|(key, _)| key == "sslmode" || key == "ssl-mode");
    // A host given as a query parameter (`?host=…`, a socket directory among them) is not looked
    // into: such URLs keep sqlx's default.
    let host_in_query = url.query_pairs().any(|(key, _)| key == "host" || key == "hostaddr");
    !chooses_mode && !host_in_query && url.host().is_some_and(|host| is_loopback(&host))
}

/// Whether `host` is `localhost` or a loopback address.
fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        // `postgres:` is not a scheme the URL standard knows, so an IPv4 address comes as a name.
        url::Host::Domain(name) => {
            name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        url::Host::Ipv4(ip) => IpAddr::V4(*ip).is_loopback(),
        url::Host::Ipv6(ip) => IpAddr::V6(*ip).is_loopback(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mode `url` gets when the environment chooses none.
    fn mode(url: &str) -> PgSslMode {
        options_with(url, false).expect("URL").get_ssl_mode()
    }

    #[test]
    fn a_loopback_host_without_a_mode_connects_in_plain() {
        for url in [
            "postgres://herald@127.0.0.1:5432/herald",
            "postgres://herald@127.9.8.7/herald",
            "postgresql://herald@localhost/herald",
            "postgres://herald@LOCALHOST:5433/herald?application_name=x",
            "postgres://herald@[::1]:5432/herald",
        ] {
            assert!(matches!(mode(url), PgSslMode::Disable), "{url}");
        }
    }

    #[test]
    fn a_mode_in_the_url_is_kept_as_given() {
        assert!(matches!(
            mode("postgres://h@127.0.0.1/db?sslmode=require"),
            PgSslMode::Require
        ));
        assert!(matches!(
            mode("postgres://h@localhost/db?ssl-mode=prefer"),
            PgSslMode::Prefer
        ));
        assert!(matches!(
            mode("postgres://h@[::1]/db?sslmode=verify-full"),
            PgSslMode::VerifyFull
        ));
    }

    #[test]
    fn any_other_host_keeps_the_default() {
        for url in [
            "postgres://h@db.internal/herald",
            "postgres://h@10.0.0.5/herald",
            "postgres://h@localhost.example.com/herald",
            "postgres://h@[2001:db8::1]/herald",
            "postgres://h@127.0.0.1/herald?host=/var/run/postgresql",
            "postgres:///herald?host=/var/run/postgresql",
        ] {
            assert!(!plain_by_default(url), "{url}");
        }
    }

    #[test]
    fn a_mode_in_the_environment_is_kept() {
        let options = options_with("postgres://h@127.0.0.1/db", true).expect("URL");
        assert!(!matches!(options.get_ssl_mode(), PgSslMode::Disable));
    }
}
