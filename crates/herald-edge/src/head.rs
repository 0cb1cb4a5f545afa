//! Reading a request head before hyper does: where it ends, whether hyper would accept it, and how
//! long the body after it is. Pure logic, no I/O.
//!
//! hyper answers a head it cannot parse with a bare status and an empty body, and offers no hook to
//! change that. So the front (`crate::front`) shows hyper only heads that this module has accepted, and
//! answers every other one itself, as JSON. To be sure that hyper never meets a head it refuses, the
//! checks here are hyper's own (hyper 1.x `proto::h1::role::Server::parse`): the same parser (httparse
//! with its default configuration), `http::Method` and `http::Uri` on the method and target, and the same
//! rules for `Content-Length` and `Transfer-Encoding` — with smaller limits, so that ours are always the
//! ones that apply.

use http::StatusCode;

/// The largest request head (request line and headers) accepted; a larger one is a 431.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;
/// The longest request target (path and query) accepted; a longer one is a 414.
pub const MAX_TARGET_BYTES: usize = 8 * 1024;
/// The most header fields a request may carry; more is a 431.
pub const MAX_HEADERS: usize = 100;

/// A request refused by the edge itself, before any application saw it: answered as JSON
/// `{code, detail}` with `status`, and the connection closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The status answered.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// A human explanation.
    pub detail: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
        }
    }

    fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    fn head_too_large() -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request line and headers exceed {MAX_HEAD_BYTES} bytes"),
        )
    }

    fn target_too_long() -> Self {
        Self::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request target exceeds {MAX_TARGET_BYTES} bytes"),
        )
    }
}

/// Whether the request line ends in `HTTP/<digit>…` of a version other than 1 (HTTP/2 prior knowledge,
/// say), rather than being malformed (a space inside the target leaves a word where the version goes).
fn names_another_version(head: &[u8]) -> bool {
    let line = head
        .split(|&b| b == b'\n')
        .find(|l| !l.is_empty() && *l != b"\r")
        .unwrap_or_default();
    let version = line
        .strip_suffix(b"\r")
        .unwrap_or(line)
        .rsplit(|&b| b == b' ')
        .next()
        .unwrap_or_default();
    match version.strip_prefix(b"HTTP/") {
        Some([major, ..]) => major.is_ascii_digit() && *major != b'1',
        _ => false,
    }
}

fn invalid_target() -> Refusal {
    Refusal::bad_request(
        "invalid_request_target",
        "the request target is not a valid URI (a forbidden character, or bytes that are not UTF-8)",
    )
}

/// How the body after a head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Fixed(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Where the head at the start of `buf` ends (the index just past its blank line), scanning from
/// `from` (bytes before it were scanned already: a slow client's head is scanned once, not once per
/// byte). A bare LF ends lines as well as CRLF, as for httparse.
pub fn find_end(buf: &[u8], from: usize) -> Option<usize> {
    // Back up so that a terminator split across two reads is found.
    let start = from.saturating_sub(3);
    let mut i = start;
    while let Some(offset) = buf.get(i..).and_then(|rest| rest.iter().position(|&b| b == b'\n')) {
        let lf = i + offset;
        match buf.get(lf + 1) {
            Some(b'\n') => return Some(lf + 2),
            Some(b'\r') if buf.get(lf + 2) == Some(&b'\n') => return Some(lf + 3),
            _ => i = lf + 1,
        }
    }
    None
}

/// Whether a head still arriving (no blank line yet) is already over a limit: its request line longer
/// than any accepted target allows (414), or the whole over [`MAX_HEAD_BYTES`] (431).
pub fn check_partial(buf: &[u8]) -> Result<(), Refusal> {
    // The request line is the method, a space, the target, a space and `HTTP/1.1`: room for a long
    // method and the version besides the target.
    const REQUEST_LINE_SLACK: usize = 64;
    let line_limit = MAX_TARGET_BYTES + REQUEST_LINE_SLACK;
    if !buf.iter().take(line_limit).any(|&b| b == b'\n') && buf.len() > line_limit {
        return Err(Refusal::target_too_long());
    }
    if buf.len() > MAX_HEAD_BYTES {
        return Err(Refusal::head_too_large());
    }
    Ok(())
}

/// Check a complete head (`head` ends with its blank line, as found by [`find_end`]) and say how its
/// body is delimited. `Ok(None)`: not a head yet after all (only blank lines so far, which a server
/// skips before a request line).
pub fn check(head: &[u8]) -> Result<Option<BodyLength>, Refusal> {
    if head.len() > MAX_HEAD_BYTES {
        return Err(Refusal::head_too_large());
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too_many_headers",
                format!("a request may carry at most {MAX_HEADERS} header fields"),
            ));
        }
        Err(httparse::Error::Version) if names_another_version(head) => {
            return Err(Refusal::new(
                StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                "http_version_not_supported",
                "this server speaks HTTP/1.0 and HTTP/1.1",
            ));
        }
        // httparse stops at the first bad byte of the method, then of the target.
        Err(httparse::Error::Token) if request.method.is_some() => return Err(invalid_target()),
        Err(error) => {
            return Err(Refusal::bad_request(
                "malformed_request",
                format!("the request head is malformed: {error}"),
            ));
        }
    }
    let (Some(method), Some(target), Some(version)) = (request.method, request.path, request.version) else {
        return Err(Refusal::bad_request(
            "malformed_request",
            "the request line is incomplete",
        ));
    };
    if http::Method::from_bytes(method.as_bytes()).is_err() {
        return Err(Refusal::bad_request(
            "malformed_request",
            "the request method is malformed",
        ));
    }
    if target.len() > MAX_TARGET_BYTES {
        return Err(Refusal::target_too_long());
    }
    if http::Uri::try_from(target.as_bytes()).is_err() {
        return Err(invalid_target());
    }
    body_length(request.headers, version == 1).map(Some)
}

/// The body's delimitation, by hyper's rules (RFC 9112 §6.3), except that a request with both
/// `Transfer-Encoding` and `Content-Length` is refused (hyper would accept it and close afterwards;
/// refusing it leaves no room for request smuggling).
fn body_length(headers: &[httparse::Header<'_>], is_http_11: bool) -> Result<BodyLength, Refusal> {
    let mut length: Option<u64> = None;
    let mut chunked = None;
    for header in headers {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            if !is_http_11 {
                return Err(Refusal::bad_request(
                    "invalid_transfer_encoding",
                    "HTTP/1.0 requests cannot use Transfer-Encoding",
                ));
            }
            // `chunked` must be the last coding; a later header field replaces an earlier one's verdict.
            let last = std::str::from_utf8(header.value)
                .ok()
                .and_then(|value| value.rsplit(',').next())
                .map(str::trim);
            chunked = Some(last.is_some_and(|coding| coding.eq_ignore_ascii_case("chunked")));
        } else if header.name.eq_ignore_ascii_case("content-length") {
            let value = digits(header.value).ok_or_else(|| {
                Refusal::bad_request(
                    "invalid_content_length",
                    "Content-Length must be a non-negative decimal number",
                )
            })?;
            if length.is_some_and(|previous| previous != value) {
                return Err(Refusal::bad_request(
                    "invalid_content_length",
                    "the request carries different Content-Length values",
                ));
            }
            length = Some(value);
        }
    }
    match (chunked, length) {
        (Some(_), Some(_)) => Err(Refusal::bad_request(
            "invalid_transfer_encoding",
            "a request cannot carry both Transfer-Encoding and Content-Length",
        )),
        (Some(true), None) => Ok(BodyLength::Chunked),
        (Some(false), None) => Err(Refusal::bad_request(
            "invalid_transfer_encoding",
            "the only transfer coding accepted is chunked, and it must come last",
        )),
        (None, Some(0) | None) => Ok(BodyLength::Empty),
        (None, Some(n)) => Ok(BodyLength::Fixed(n)),
    }
}

/// A `Content-Length` value: decimal digits only (no sign, no spaces inside), within `u64` and below
/// hyper's own maximum.
fn digits(value: &[u8]) -> Option<u64> {
    // hyper refuses lengths from u64::MAX - 1 up (it reserves them for its own markers).
    const HYPER_MAX: u64 = u64::MAX - 2;
    if value.is_empty() {
        return None;
    }
    value
        .iter()
        .try_fold(0u64, |n, &b| {
            b.is_ascii_digit()
                .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
                .flatten()
        })
        .filter(|&n| n <= HYPER_MAX)
}

/// Follows a chunked body (RFC 9112 §7.1) byte by byte, as hyper's decoder reads it, only to know where
/// it ends: the bytes themselves go to hyper unchanged.
#[derive(Debug, Clone, Default)]
pub struct ChunkedTracker {
    state: ChunkState,
    size: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum ChunkState {
    /// The first hex digit of a chunk size.
    #[default]
    Start,
    /// More hex digits, or what follows them.
    Size,
    /// Blanks after the size.
    SizeBlank,
    /// A chunk extension, up to its CR.
    Extension,
    /// The LF ending the size line.
    SizeLf,
    /// `size` bytes of data.
    Data,
    /// The CR after the data.
    DataCr,
    /// The LF after the data.
    DataLf,
    /// After the last chunk: a CR (the end) or a trailer field.
    EndCr,
    /// The final LF.
    EndLf,
    /// A trailer field, up to its CR.
    Trailer,
    /// The LF ending a trailer field.
    TrailerLf,
    /// The body has ended.
    Done,
}

/// What [`ChunkedTracker::feed`] found in the bytes it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunks {
    /// All of them are body; more is to come.
    More,
    /// The body ends after this many of them.
    End(usize),
    /// The body is malformed at this offset (hyper will refuse it too).
    Malformed(usize),
}

impl ChunkedTracker {
    /// Follow the body through `bytes`.
    pub fn feed(&mut self, bytes: &[u8]) -> Chunks {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == ChunkState::Data {
                let available = u64::try_from(bytes.len() - i).unwrap_or(u64::MAX);
                let take = self.size.min(available);
                // `take` is at most `bytes.len() - i`, so it fits in usize.
                i += usize::try_from(take).unwrap_or(bytes.len() - i);
                self.size -= take;
                if self.size == 0 {
                    self.state = ChunkState::DataCr;
                }
                continue;
            }
            let Some(next) = self.step(bytes[i]) else {
                return Chunks::Malformed(i);
            };
            self.state = next;
            i += 1;
            if next == ChunkState::Done {
                return Chunks::End(i);
            }
        }
        Chunks::More
    }

    fn step(&mut self, byte: u8) -> Option<ChunkState> {
        use ChunkState::*;
        let hex = |b: u8| char::from(b).to_digit(16).map(u64::from);
        Some(match (self.state, byte) {
            (Start, b) => {
                self.size = hex(b)?;
                Size
            }
            (Size, b) if hex(b).is_some() => {
                self.size = self.size.checked_mul(16)?.checked_add(hex(b)?)?;
                Size
            }
            (Size | SizeBlank, b' ' | b'\t') => SizeBlank,
            (Size | SizeBlank, b';') => Extension,
            (Size | SizeBlank | Extension, b'\r') => SizeLf,
            (Extension, b'\n') => return None,
            (Extension, _) => Extension,
            (SizeLf, b'\n') if self.size == 0 => EndCr,
            (SizeLf, b'\n') => Data,
            (DataCr, b'\r') => DataLf,
            (DataLf, b'\n') => Start,
            (EndCr, b'\r') => EndLf,
            (Trailer, b'\r') => TrailerLf,
            (EndCr | Trailer, _) => Trailer,
            (TrailerLf, b'\n') => EndCr,
            (EndLf, b'\n') => Done,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Vec<u8> {
        text.replace('\n', "\r\n").into_bytes()
    }

    #[test]
    fn the_end_of_a_head_is_found_once_and_across_reads() {
        let bytes = head("GET / HTTP/1.1\nHost: x\n\nnext");
        let end = bytes.len() - 4;
        assert_eq!(find_end(&bytes, 0), Some(end));
        for from in 0..end {
            assert_eq!(find_end(&bytes[..end], from), Some(end), "from {from}");
        }
        assert_eq!(find_end(&bytes[..end - 1], 0), None);
        assert_eq!(find_end(b"GET / HTTP/1.1\nHost: x\n\n", 0), Some(24));
    }

    #[test]
    fn well_formed_heads_say_how_their_body_ends() {
        let cases = [
            ("GET /api/v1/health HTTP/1.1\nHost: x\n\n", BodyLength::Empty),
            ("POST /in/a HTTP/1.1\nContent-Length: 0\n\n", BodyLength::Empty),
            (
                "POST /in/a HTTP/1.1\nContent-Length: 12\ncontent-length: 12\n\n",
                BodyLength::Fixed(12),
            ),
            (
                "POST /in/a HTTP/1.1\nTransfer-Encoding: gzip, chunked\n\n",
                BodyLength::Chunked,
            ),
            ("GET http://example.com/x?y=1 HTTP/1.0\n\n", BodyLength::Empty),
            // hyper takes UTF-8 in a target (http 1.x does), so the edge does too.
            ("GET /café HTTP/1.1\n\n", BodyLength::Empty),
        ];
        for (text, expected) in cases {
            assert_eq!(check(&head(text)), Ok(Some(expected)), "{text}");
        }
        assert_eq!(check(b"\r\n\r\n"), Ok(None));
    }

    #[test]
    fn malformed_heads_are_refused_with_their_own_code() {
        let long_target = format!("GET /{} HTTP/1.1\n\n", "a".repeat(MAX_TARGET_BYTES));
        let many_headers = format!("GET / HTTP/1.1\n{}\n", "X-A: b\n".repeat(MAX_HEADERS + 1));
        let cases: Vec<(Vec<u8>, u16, &str)> = vec![
            (
                head("POST / HTTP/1.1\nContent-Length: -5\n\n"),
                400,
                "invalid_content_length",
            ),
            (
                head("POST / HTTP/1.1\nContent-Length: 1 2\n\n"),
                400,
                "invalid_content_length",
            ),
            (
                head("POST / HTTP/1.1\nContent-Length: 99999999999999999999999\n\n"),
                400,
                "invalid_content_length",
            ),
            (
                head("POST / HTTP/1.1\nContent-Length: 1\nContent-Length: 2\n\n"),
                400,
                "invalid_content_length",
            ),
            (
                head("POST / HTTP/1.1\nTransfer-Encoding: chunked\nContent-Length: 3\n\n"),
                400,
                "invalid_transfer_encoding",
            ),
            (
                head("POST / HTTP/1.1\nTransfer-Encoding: chunked, gzip\n\n"),
                400,
                "invalid_transfer_encoding",
            ),
            (
                head("POST / HTTP/1.0\nTransfer-Encoding: chunked\n\n"),
                400,
                "invalid_transfer_encoding",
            ),
            (
                b"GET /\xff\xfe HTTP/1.1\r\n\r\n".to_vec(),
                400,
                "invalid_request_target",
            ),
            (head("G(T / HTTP/1.1\n\n"), 400, "malformed_request"),
            (head("GET / HTTP/1.1\nBad Header: x\n\n"), 400, "malformed_request"),
            (head("GET / HTTP/2.0\n\n"), 505, "http_version_not_supported"),
            (head("GET /a b HTTP/1.1\n\n"), 400, "malformed_request"),
            (head("GET / HTTP/1.2x\n\n"), 400, "malformed_request"),
            (head("PRI * HTTP/2.0\n\nSM\n\n"), 505, "http_version_not_supported"),
            (head(&long_target), 414, "uri_too_long"),
            (head(&many_headers), 431, "too_many_headers"),
        ];
        for (bytes, status, code) in cases {
            let refusal = check(&bytes).expect_err(&String::from_utf8_lossy(&bytes));
            assert_eq!(
                (refusal.status.as_u16(), refusal.code),
                (status, code),
                "{}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }

    #[test]
    fn heads_still_arriving_are_refused_once_over_a_limit() {
        assert!(check_partial(b"GET /abc").is_ok());
        let long_line = format!("GET /{}", "a".repeat(MAX_TARGET_BYTES + 100));
        assert_eq!(check_partial(long_line.as_bytes()).unwrap_err().code, "uri_too_long");
        let big = format!("GET / HTTP/1.1\r\n{}", "X-A: b\r\n".repeat(MAX_HEAD_BYTES / 8 + 1));
        assert_eq!(check_partial(big.as_bytes()).unwrap_err().code, "headers_too_large");
    }

    fn track(bytes: &[u8]) -> Chunks {
        ChunkedTracker::default().feed(bytes)
    }

    #[test]
    fn chunked_bodies_end_where_hyper_ends_them() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        let end = body.len() - "GET / HTTP/1.1\r\n".len();
        assert_eq!(track(body), Chunks::End(end));
        // Byte by byte: the same end.
        let mut tracker = ChunkedTracker::default();
        let ended = (0..body.len()).find(|&i| tracker.feed(&body[i..=i]) == Chunks::End(1));
        assert_eq!(ended, Some(end - 1));
        assert_eq!(
            track(b"A \r\n0123456789\r\n0\r\nExpires: never\r\n\r\n"),
            Chunks::End(37)
        );
        assert_eq!(track(b"5\r\nhel"), Chunks::More);
    }

    #[test]
    fn malformed_chunked_bodies_are_noticed() {
        assert_eq!(track(b"x\r\n"), Chunks::Malformed(0));
        assert_eq!(track(b"5\nhello"), Chunks::Malformed(1));
        assert_eq!(track(b"5;a\nhello"), Chunks::Malformed(3));
        assert_eq!(track(b"2\r\nhiX"), Chunks::Malformed(5));
        assert_eq!(track(b"fffffffffffffffff\r\n"), Chunks::Malformed(16));
    }
}
