//! Pagination of lists: `?limit=N` (1 to [`MAX_LIMIT`]) and `?after=KEY`, keyset
//! pagination as GitHub's and Stripe's APIs do it. A paged list is in key order (a
//! device's, deployment's or token's name or id; a model's `name:version`; a job's
//! `region/tenant/name`), so a page is stable while objects come and go: nothing is
//! skipped or shown twice because something before it was deleted. The next page is
//! in the `Link: <…>; rel="next"` header, absent on the last page; `X-Total-Count` says
//! how many the whole list holds. Without `limit` and `after` a list is answered whole,
//! in its usual order, as before.

use actix_web::{HttpRequest, HttpResponse};
use serde::Serialize;

use crate::federation::ApiError;

/// The most items one page holds.
pub const MAX_LIMIT: usize = 1000;

/// What the query asks of a list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Page {
    pub limit: Option<usize>,
    pub after: Option<String>,
}

impl Page {
    /// `limit` and `after` from `query` (other parameters are the route's own).
    pub fn parse(query: &str) -> Result<Page, ApiError> {
        let mut page = Page::default();
        for (key, value) in pairs(query) {
            match key.as_str() {
                "limit" => {
                    let limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| ApiError::Invalid {
                            field: "limit".into(),
                            message: format!(
                                "limit={value:?}: give a number of items per page from 1 to {MAX_LIMIT}"
                            ),
                        })?;
                    page.limit = Some(limit);
                }
                "after" => page.after = Some(value),
                _ => {}
            }
        }
        Ok(page)
    }

    /// Whether a page was asked for (else the list is answered whole).
    pub fn is_paged(&self) -> bool {
        self.limit.is_some() || self.after.is_some()
    }

    /// How many items to fetch for this page when the list is read in key order from
    /// `after` on: one more than the page holds, which says whether a next page exists
    /// (everything when the list is not paged).
    pub fn fetch(&self) -> usize {
        if self.is_paged() {
            self.limit.unwrap_or(MAX_LIMIT) + 1
        } else {
            usize::MAX
        }
    }

    /// The page of `items` read in key order from `after` on (at most
    /// [`Page::fetch`] of them) and, when more follow, the key to ask the next page
    /// after.
    pub fn window<T>(
        &self,
        mut items: Vec<T>,
        key: impl Fn(&T) -> String,
    ) -> (Vec<T>, Option<String>) {
        let limit = self.fetch().saturating_sub(1);
        let next = (items.len() > limit).then(|| key(&items[limit - 1]));
        items.truncate(limit);
        (items, next)
    }

    /// The page of `items` (keyed by `key`) and, when more follow, the key to ask
    /// the next page after; the total.
    pub fn select<T>(
        &self,
        mut items: Vec<T>,
        key: impl Fn(&T) -> String,
    ) -> (Vec<T>, Option<String>, usize) {
        let total = items.len();
        if !self.is_paged() {
            return (items, None, total);
        }
        items.sort_by_cached_key(|item| key(item));
        if let Some(after) = &self.after {
            items.retain(|item| key(item).as_str() > after.as_str());
        }
        let (items, next) = self.window(items, key);
        (items, next, total)
    }
}

/// The answer to a list request: its page of `items`, with `Link` and
/// `X-Total-Count`.
pub fn answer<T: Serialize>(
    request: &HttpRequest,
    items: Vec<T>,
    key: impl Fn(&T) -> String,
) -> Result<HttpResponse, ApiError> {
    let page = Page::parse(request.query_string())?;
    let (items, next, total) = page.select(items, key);
    respond(request, &page, items, next, total)
}

/// The answer to a list request whose items the caller read itself in key order:
/// `items` are those after `page.after`, at most [`Page::fetch`] of them; `total` is
/// the whole list's length.
pub fn answer_fetched<T: Serialize>(
    request: &HttpRequest,
    page: &Page,
    items: Vec<T>,
    total: usize,
    key: impl Fn(&T) -> String,
) -> Result<HttpResponse, ApiError> {
    let (items, next) = page.window(items, key);
    respond(request, page, items, next, total)
}

fn respond<T: Serialize>(
    request: &HttpRequest,
    page: &Page,
    items: Vec<T>,
    next: Option<String>,
    total: usize,
) -> Result<HttpResponse, ApiError> {
    let mut response = HttpResponse::Ok();
    response.insert_header(("x-total-count", total.to_string()));
    if let Some(next) = next {
        let mut query: Vec<String> = pairs(request.query_string())
            .filter(|(k, _)| k != "after" && k != "limit")
            .map(|(k, v)| format!("{}={}", encode(&k), encode(&v)))
            .collect();
        query.push(format!("limit={}", page.limit.unwrap_or(MAX_LIMIT)));
        query.push(format!("after={}", encode(&next)));
        response.insert_header((
            "link",
            format!("<{}?{}>; rel=\"next\"", request.path(), query.join("&")),
        ));
    }
    Ok(response.json(items))
}

fn pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k), decode(v))
    })
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(byte) => {
                    out.push(byte);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn limits_outside_one_to_the_maximum_are_refused_naming_the_field() {
        for bad in ["limit=0", "limit=1001", "limit=x", "limit=-1", "limit="] {
            match Page::parse(bad) {
                Err(ApiError::Invalid { field, .. }) => assert_eq!(field, "limit"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert_eq!(
            Page::parse("region=eu&limit=2&after=a%2Fb"),
            Ok(Page {
                limit: Some(2),
                after: Some("a/b".into())
            })
        );
    }

    #[test]
    fn an_unpaged_list_is_whole_and_in_its_own_order() {
        let (items, next, total) = Page::default().select(vec!["b", "a"], |s| s.to_string());
        assert_eq!((items, next, total), (vec!["b", "a"], None, 2));
    }

    proptest! {
        /// Following `after` page by page gives every item once, in key order, even
        /// when items before the cursor are deleted between pages.
        #[test]
        fn pages_cover_the_list_once_in_key_order(
            keys in proptest::collection::btree_set("[a-z]{1,6}", 0..60),
            limit in 1usize..8,
            delete_every in 2usize..5,
        ) {
            let mut list: Vec<String> = keys.iter().cloned().rev().collect();
            let mut seen = Vec::new();
            let mut page = Page { limit: Some(limit), after: None };
            loop {
                let (items, next, _) = page.select(list.clone(), |s| s.clone());
                prop_assert!(items.len() <= limit);
                seen.extend(items.iter().cloned());
                // Something already seen goes away between pages.
                if let Some(gone) = seen.iter().step_by(delete_every).next().cloned() {
                    list.retain(|k| *k != gone);
                }
                match next {
                    Some(after) => page.after = Some(after),
                    None => break,
                }
            }
            let expected: Vec<String> = keys.into_iter().collect();
            prop_assert_eq!(seen, expected);
        }

        /// A page read by its caller in key order from `after` on, `fetch()` items,
        /// is the page `select` makes of the whole list.
        #[test]
        fn a_window_read_from_the_cursor_is_the_selected_page(
            keys in proptest::collection::btree_set("[a-z]{1,6}", 0..60),
            limit in proptest::option::of(1usize..8),
            after in proptest::option::of("[a-z]{1,3}"),
        ) {
            let page = Page { limit, after: after.clone() };
            let whole: Vec<String> = keys.iter().cloned().collect();
            let read: Vec<String> = keys
                .iter()
                .filter(|k| after.as_ref().is_none_or(|a| k.as_str() > a.as_str()))
                .take(page.fetch())
                .cloned()
                .collect();
            let (items, next) = page.window(read, |s| s.clone());
            let (want, want_next, _) = page.select(whole, |s| s.clone());
            prop_assert_eq!(items, want);
            prop_assert_eq!(next, want_next);
        }

        #[test]
        fn encoding_then_decoding_gives_the_value_back(value in ".{0,20}") {
            prop_assert_eq!(decode(&encode(&value)), value);
        }
    }
}
