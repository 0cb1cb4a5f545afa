//! File descriptors: each connection holds one, and running out of them stops `accept` for everyone.
//! The edge raises the soft limit to the hard one (as Go's runtime does), then keeps its connection
//! cap below what the limit leaves once the rest of the process has its share.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::registry::CLOSING_ALLOWANCE;

/// Descriptors kept for the process itself besides what the caller reserves: the listener, the
/// runtime's, standard streams, database files.
const BASE_RESERVE: u64 = 64;
/// The cap never goes below this, however low the limit (the process would be unusable anyway).
const MIN_CONNECTIONS: usize = 16;
/// Linux refuses soft limits above `fs.nr_open` (1,048,576 by default) even when the hard one is unlimited.
const NR_OPEN_DEFAULT: u64 = 1 << 20;

/// Raise the soft limit on open files as far as the hard one allows, and return it (`None`: unlimited).
fn raise_soft_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current?;
    let target = limit.maximum.unwrap_or(NR_OPEN_DEFAULT);
    if target > current
        && setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: limit.maximum,
            },
        )
        .is_ok()
    {
        return Some(target);
    }
    Some(current)
}

/// The connection cap: `configured`, lowered to the descriptors left after `reserved` ones (e.g. the
/// delivery engine's outbound connections), the process's own, and those of evicted connections not
/// closed yet.
pub(crate) fn connection_cap(configured: usize, reserved: usize) -> usize {
    let Some(limit) = raise_soft_limit() else {
        return configured;
    };
    let held_back = BASE_RESERVE + CLOSING_ALLOWANCE as u64 + reserved as u64;
    let left = limit.saturating_sub(held_back);
    let budget = usize::try_from(left).unwrap_or(usize::MAX).max(MIN_CONNECTIONS);
    if budget < configured {
        tracing::warn!(
            max_connections = configured,
            open_file_limit = limit,
            reserved = held_back,
            cap = budget,
            "the open-file limit allows fewer connections than max_connections; raise it (ulimit -n, LimitNOFILE=) \
             or lower max_connections"
        );
        return budget;
    }
    configured
}
