//! Cursor pagination in the Svix style: `limit` + `iterator` in, `data`/`iterator`/`prevIterator`/`done` out.
//!
//! The iterator is the sort key of the last item returned (ids are time-ordered, so for most listings it
//! is simply the id). A `prevIterator` is the first item's key prefixed with `-`: passing it back walks
//! the other way, which is how Svix clients page backwards.

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// At most this many items (1..=250).
    pub limit: usize,
    /// Continue after this key (or before it, when `reverse`).
    pub after: Option<String>,
    /// The iterator was a `prevIterator`: walk back from `after`.
    pub reverse: bool,
}

impl PageRequest {
    /// The default page size.
    pub const DEFAULT_LIMIT: usize = 50;
    /// The largest page size.
    pub const MAX_LIMIT: usize = 250;

    /// Build from the query parameters; `limit` is clamped to 1..=250.
    pub fn new(limit: Option<usize>, iterator: Option<String>) -> Self {
        let limit = limit.unwrap_or(Self::DEFAULT_LIMIT).clamp(1, Self::MAX_LIMIT);
        match iterator.filter(|s| !s.is_empty()) {
            Some(it) => match it.strip_prefix('-') {
                Some(rest) => Self {
                    limit,
                    after: Some(rest.to_owned()),
                    reverse: true,
                },
                None => Self {
                    limit,
                    after: Some(it),
                    reverse: false,
                },
            },
            None => Self {
                limit,
                after: None,
                reverse: false,
            },
        }
    }

    /// The first page of the given size.
    pub fn first(limit: usize) -> Self {
        Self::new(Some(limit), None)
    }
}

impl Default for PageRequest {
    fn default() -> Self {
        Self::new(None, None)
    }
}

/// One page of results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items, in the listing's order.
    pub items: Vec<T>,
    /// Pass this back to get the next page.
    pub iterator: Option<String>,
    /// Pass this back to get the previous page.
    pub prev_iterator: Option<String>,
    /// No more items after this page.
    pub done: bool,
}

impl<T> Page<T> {
    /// Assemble a page from `limit + 1` fetched rows (the extra row only tells whether more exist).
    ///
    /// `rows` come in the direction of travel; a reverse page is flipped back into listing order.
    pub fn assemble(mut rows: Vec<T>, request: &PageRequest, key: impl Fn(&T) -> String) -> Self {
        let more = rows.len() > request.limit;
        rows.truncate(request.limit);
        if request.reverse {
            rows.reverse();
        }
        let iterator = rows.last().map(&key);
        let prev_iterator = rows.first().map(|first| format!("-{}", key(first)));
        // Walking backwards, "done" would mean "nothing earlier"; Svix clients read `done` as "no next
        // page", and after a backwards step there is always the page we came from.
        let done = if request.reverse { false } else { !more };
        Page {
            items: rows,
            iterator,
            prev_iterator,
            done,
        }
    }

    /// Convert the items, keeping the cursors.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            iterator: self.iterator,
            prev_iterator: self.prev_iterator,
            done: self.done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iterators_and_clamps_limits() {
        assert_eq!(PageRequest::new(Some(0), None).limit, 1);
        assert_eq!(PageRequest::new(Some(10_000), None).limit, 250);
        let back = PageRequest::new(None, Some("-abc".into()));
        assert!(back.reverse);
        assert_eq!(back.after.as_deref(), Some("abc"));
        assert_eq!(PageRequest::new(None, Some(String::new())).after, None);
    }

    #[test]
    fn assembles_pages() {
        let req = PageRequest::first(2);
        let page = Page::assemble(vec![1, 2, 3], &req, |n| n.to_string());
        assert_eq!(page.items, [1, 2]);
        assert!(!page.done);
        assert_eq!(page.iterator.as_deref(), Some("2"));
        assert_eq!(page.prev_iterator.as_deref(), Some("-1"));
        let last = Page::assemble(vec![3], &req, |n| n.to_string());
        assert!(last.done);
        let back = Page::assemble(vec![2, 1], &PageRequest::new(Some(2), Some("-3".into())), |n| {
            n.to_string()
        });
        assert_eq!(back.items, [1, 2]);
    }
}
