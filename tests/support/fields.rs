//! The `RateLimit-Policy` and `RateLimit` fields parsed as the
//! structured-field Lists they are, for the tests of the layers.

use std::collections::BTreeMap;

/// One parsed List item: its name and its integer parameters.
pub type ListItem = (String, BTreeMap<String, i64>);

/// The items of a List field's value (every line of it joined by ", ").
pub fn parse_list(field: &str) -> Vec<ListItem> {
    if field.is_empty() {
        return Vec::new();
    }
    let list = sfv::Parser::new(field)
        .parse_list()
        .unwrap_or_else(|e| panic!("{field:?} is not a structured-field List: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .expect("a policy name is a String")
                    .as_str()
                    .to_owned();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_owned(),
                            v.as_integer().expect("integer").into(),
                        )
                    })
                    .collect();
                (name, params)
            }
            sfv::ListEntry::InnerList(_) => panic!("{field:?}: an inner list"),
        })
        .collect()
}

/// The items of the List field `name` in `headers`, every line of it.
pub fn list(headers: &http::HeaderMap, name: &str) -> Vec<ListItem> {
    let joined = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ASCII"))
        .collect::<Vec<_>>()
        .join(", ");
    parse_list(&joined)
}

/// The names of the items, in order.
pub fn names(items: &[ListItem]) -> Vec<&str> {
    items.iter().map(|(n, _)| n.as_str()).collect()
}

/// Item `name`'s parameter `param`.
pub fn param(items: &[ListItem], name: &str, param: &str) -> Option<i64> {
    items
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, params)| params.get(param).copied())
}
