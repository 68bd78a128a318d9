//! The README and the book under `docs/` hold together: the README stays a short guide
//! (at most 400 lines, with its table of contents), and every relative link in the
//! README, `ARCHITECTURE.md` and `docs/*.md` names a file that exists and, with an
//! `#anchor`, a heading of that file (GitHub's rule: lowercase, spaces to `-`,
//! punctuation other than `-` and `_` dropped, a repeated heading numbered `-1`, `-2`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The anchors GitHub gives the headings of a markdown text (outside code fences).
fn anchors(text: &str) -> HashSet<String> {
    let mut found = HashSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        found.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    found
}

/// Every `](target)` of a markdown text outside code fences and inline code.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Inline code spans hold examples, not links.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].trim().to_string());
            rest = &after[end..];
        }
    }
    found
}

fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut book: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    book.sort();
    files.extend(book);
    files
}

#[test]
fn every_relative_link_in_the_readme_and_the_book_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("readable");
        let dir = file.parent().expect("a folder");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") || link.is_empty() {
                continue;
            }
            let (path, anchor) = match link.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            checked += 1;
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let heads = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
                if !heads.contains(anchor) {
                    broken.push(format!(
                        "{}: {link}: no heading with that anchor",
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser reading the files?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_short_guide_with_a_table_of_contents() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines; move reference and benchmark material into docs/"
    );
    assert!(
        readme.contains("## Contents"),
        "README.md has no table of contents"
    );
    // The book's index names every chapter.
    let index = std::fs::read_to_string(Path::new(ROOT).join("docs/README.md")).expect("index");
    for chapter in documents().iter().skip(2) {
        let name = chapter.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name != "README.md" {
            assert!(index.contains(name), "docs/README.md does not list {name}");
        }
    }
}

#[test]
fn anchors_and_links_read_as_github_makes_them() {
    let heads = anchors(
        "# The CLI's common flows, as they print\n## Jobs\n## Jobs\n```\n# not a heading\n```\n",
    );
    assert!(
        heads.contains("the-clis-common-flows-as-they-print"),
        "{heads:?}"
    );
    assert!(
        heads.contains("jobs") && heads.contains("jobs-1"),
        "{heads:?}"
    );
    assert!(!heads.contains("not-a-heading"));
    assert_eq!(
        links("see [a](x.md#y) and `[b](not-a-link)` and [c](../z)"),
        ["x.md#y", "../z"]
    );
}
