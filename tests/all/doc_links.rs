//! The docs' links: every relative link in the repository's Markdown (README.md,
//! BENCHMARKS.md, the book in `docs/`, the notes beside the code) names a file that
//! exists inside the repository, and every `#anchor` names a heading of its page by
//! GitHub's rules; every page of the book is listed in `docs/SUMMARY.md`. A page that
//! moves or a heading that is renamed fails here rather than 404 on a reader.
//!
//! The checker reads Markdown as far as links need: fenced code blocks and code spans
//! hold no links, `[text](target)`, `![alt](target)` and `[label]: target` do. Headings
//! are ATX headings (`## Title`); GitHub's anchor is the heading's text, lower-cased,
//! with everything but letters, digits, `-`, `_` and spaces dropped and each space made
//! a `-`, and `-1`, `-2`, ... appended to repeats. Links with a scheme (`https:`,
//! `mailto:`) are not followed: CI has no network, and their pages are not ours.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

/// The repository: the integration tests belong to `cli/`, one level down.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo_root();
    let broken = broken_links(&root);
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the repository's Markdown:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let root = repo_root();
    let missing = pages_missing_from_summary(&root.join("docs"));
    assert!(
        missing.is_empty(),
        "pages of docs/ not listed in docs/SUMMARY.md: {missing:?}"
    );
}

/// Every broken link under `root`, as `path:line: what`, in file order.
fn broken_links(root: &Path) -> Vec<String> {
    let mut pages = HashMap::new();
    let mut broken = Vec::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).expect("a Markdown file reads as UTF-8");
        let page = scan(&text);
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for link in &page.links {
            if let Some(why) = check_link(root, &file, link, &page, &mut pages) {
                broken.push(format!("{shown}:{}: {} ({why})", link.line, link.target));
            }
        }
    }
    broken
}

/// Why `link`, found in `file`, is broken; `None` when it resolves.
fn check_link(
    root: &Path,
    file: &Path,
    link: &Link,
    page: &Page,
    pages: &mut HashMap<PathBuf, Page>,
) -> Option<String> {
    let target = link.target.as_str();
    if has_scheme(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    if path.is_empty() {
        let anchor = anchor.unwrap_or_default();
        return (!anchor.is_empty() && !page.anchors.contains(anchor))
            .then(|| format!("no heading #{anchor} on this page"));
    }
    let path = percent_decode(path);
    let resolved = match path.strip_prefix('/') {
        Some(from_root) => normalize(&root.join(from_root)),
        None => normalize(&file.parent().expect("a file has a folder").join(&path)),
    };
    if !resolved.starts_with(root) {
        return Some("outside the repository".into());
    }
    if !resolved.exists() {
        return Some("no such file".into());
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if resolved.extension().is_none_or(|ext| ext != "md") {
        // An anchor into code (`#L10`) or a folder is GitHub's to place, not a heading.
        return None;
    }
    let target_page = pages.entry(resolved.clone()).or_insert_with(|| {
        scan(&std::fs::read_to_string(&resolved).expect("a Markdown file reads as UTF-8"))
    });
    (!target_page.anchors.contains(anchor)).then(|| format!("no heading #{anchor} there"))
}

/// The pages under `docs` (recursively) that `docs/SUMMARY.md` does not link to.
fn pages_missing_from_summary(docs: &Path) -> Vec<String> {
    let summary = docs.join("SUMMARY.md");
    let text = std::fs::read_to_string(&summary).expect("docs/SUMMARY.md exists");
    let listed: BTreeSet<PathBuf> = scan(&text)
        .links
        .iter()
        .filter(|link| !has_scheme(&link.target))
        .map(|link| link.target.split('#').next().unwrap_or_default())
        .filter(|path| !path.is_empty())
        .map(|path| normalize(&docs.join(percent_decode(path))))
        .collect();
    markdown_files(docs)
        .into_iter()
        .filter(|page| *page != summary && !listed.contains(page))
        .map(|page| {
            page.strip_prefix(docs)
                .unwrap_or(&page)
                .display()
                .to_string()
        })
        .collect()
}

/// The `.md` files under `dir`, sorted; build output and hidden folders are not docs.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a folder of the repository reads") {
            let entry = entry.expect("a folder entry reads");
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type().expect("a folder entry has a type");
            if kind.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    folders.push(path);
                }
            } else if name.ends_with(".md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// A link found on a page: where it points and on which line (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

/// What the checker needs of a page: its headings' anchors and its links.
#[derive(Debug, Default)]
struct Page {
    anchors: BTreeSet<String>,
    links: Vec<Link>,
}

/// Reads a page: headings and links outside fenced code. Paragraphs are read whole,
/// because a code span (and a link's text) may run over a line break.
fn scan(text: &str) -> Page {
    let mut page = Page::default();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut fence: Option<(char, usize)> = None;
    let mut block: Vec<&str> = Vec::new();
    let mut block_start = 0;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some((ch, len)) = fence {
            let run = trimmed.chars().take_while(|&c| c == ch).count();
            if run >= len && trimmed[run..].trim().is_empty() {
                fence = None;
            }
            continue;
        }
        let opening = ['`', '~']
            .into_iter()
            .map(|ch| (ch, trimmed.chars().take_while(|&c| c == ch).count()))
            .find(|&(_, run)| run >= 3);
        if opening.is_some() || trimmed.is_empty() || heading_text(line).is_some() {
            scan_block(&block, block_start, &mut page.links);
            block.clear();
        }
        if let Some(opening) = opening {
            fence = Some(opening);
        } else if let Some(heading) = heading_text(line) {
            let slug = slug(heading);
            let count = seen.entry(slug.clone()).or_insert(0);
            let anchor = match *count {
                0 => slug.clone(),
                n => format!("{slug}-{n}"),
            };
            *count += 1;
            page.anchors.insert(anchor);
            scan_block(&[line], index + 1, &mut page.links);
        } else if !trimmed.is_empty() {
            if block.is_empty() {
                block_start = index + 1;
            }
            block.push(line);
        }
    }
    scan_block(&block, block_start, &mut page.links);
    page
}

/// The text of an ATX heading (`## Title ##` gives `Title`), if `line` is one.
fn heading_text(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let level = rest.chars().take_while(|&c| c == '#').count();
    if indent > 3 || !(1..=6).contains(&level) {
        return None;
    }
    let text = &rest[level..];
    if !(text.is_empty() || text.starts_with([' ', '\t'])) {
        return None;
    }
    let text = text.trim();
    let closed = text.trim_end_matches('#');
    Some(if closed.is_empty() || closed.ends_with([' ', '\t']) {
        closed.trim_end()
    } else {
        text
    })
}

/// GitHub's anchor for a heading: the rendered text (code spans keep their text, a
/// link keeps its text), lower-cased, letters, digits, `-` and `_` kept, spaces made `-`.
fn slug(heading: &str) -> String {
    let mut rendered = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        rendered.push_str(&rest[..open]);
        match link_at(rest, open) {
            Some((text, _, end)) => {
                rendered.push_str(text);
                rest = &rest[end..];
            }
            None => {
                rendered.push('[');
                rest = &rest[open + 1..];
            }
        }
    }
    rendered.push_str(rest);
    rendered
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Collects the links of a paragraph whose first line is `first_line`.
fn scan_block(lines: &[&str], first_line: usize, links: &mut Vec<Link>) {
    if lines.is_empty() {
        return;
    }
    let text = blank_code_spans(&lines.join("\n"));
    let line_of = |offset: usize| first_line + text[..offset].matches('\n').count();
    for (index, line) in text.lines().enumerate() {
        if let Some(target) = reference_definition(line) {
            links.push(Link {
                line: first_line + index,
                target: target.to_string(),
            });
        }
    }
    let mut from = 0;
    while let Some(open) = text[from..].find('[').map(|at| from + at) {
        if text[..open].ends_with('\\') {
            from = open + 1;
            continue;
        }
        match link_at(&text, open) {
            Some((_, target, end)) => {
                links.push(Link {
                    line: line_of(open),
                    target: target.to_string(),
                });
                // The text may hold an image (`[![alt](img)](page)`): read it too.
                debug_assert!(end > open);
                from = open + 1;
            }
            None => from = open + 1,
        }
    }
}

/// `[text](target)` starting at `open` (a `[`): its text, its target and where it ends.
fn link_at(text: &str, open: usize) -> Option<(&str, &str, usize)> {
    let bytes = text.as_bytes();
    let mut depth = 0;
    let mut close = None;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        match b {
            b'\\' => continue,
            b'[' if i == 0 || bytes[i - 1] != b'\\' => depth += 1,
            b']' if bytes[i - 1] != b'\\' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close?;
    let after = &text[close + 1..];
    let inner = after.strip_prefix('(')?;
    let inner_start = close + 2;
    let lead = inner.len() - inner.trim_start().len();
    let dest = &inner[lead..];
    let (target, used) = if let Some(angled) = dest.strip_prefix('<') {
        let end = angled.find('>')?;
        (&angled[..end], end + 2)
    } else {
        let mut parens = 0usize;
        let mut end = dest.len();
        for (i, c) in dest.char_indices() {
            match c {
                '(' => parens += 1,
                ')' if parens == 0 => {
                    end = i;
                    break;
                }
                ')' => parens -= 1,
                c if c.is_whitespace() => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        (&dest[..end], end)
    };
    // A title (`"..."`) may follow the target; the link ends at its `)`.
    let tail = &dest[used..];
    let close_paren = tail.find(')')?;
    let end = inner_start + lead + used + close_paren + 1;
    Some((&text[open + 1..close], target, end))
}

/// `[label]: target` (a link reference definition), if `line` is one.
fn reference_definition(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = line[indent..].strip_prefix('[')?;
    if indent > 3 || rest.starts_with('^') {
        return None;
    }
    let (label, after) = rest.split_once("]:")?;
    if label.is_empty() || label.contains(['[', ']']) {
        return None;
    }
    let target = after.split_whitespace().next()?;
    Some(target.trim_start_matches('<').trim_end_matches('>'))
}

/// `text` with every code span's contents (backticks included) turned into spaces, so
/// that brackets in code are not read as links; line breaks stay, to count lines.
fn blank_code_spans(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' || (i > 0 && bytes[i - 1] == b'\\') {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let mut j = i + run;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let other = bytes[j..].iter().take_while(|&&b| b == b'`').count();
                if other == run {
                    close = Some(j);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(close) => {
                for b in &mut out[i..close + run] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = close + run;
            }
            None => i += run,
        }
    }
    // Only ASCII bytes were replaced, by ASCII: still UTF-8.
    String::from_utf8(out).expect("blanking ASCII keeps UTF-8")
}

/// Whether a link target names a scheme (`https:`, `mailto:`) rather than a path.
fn has_scheme(target: &str) -> bool {
    match target.find(':') {
        Some(colon) => {
            let scheme = &target[..colon];
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

/// `%20` and friends decoded, as a browser does before asking for the file.
fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a/b/../c` as `a/c`, without asking the file system (the target may be missing).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

mod checker {
    //! The checker itself, on a small tree of good and bad links.

    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn anchors_follow_githubs_rules() {
        assert_eq!(
            slug("Keys, namespaces and reuse"),
            "keys-namespaces-and-reuse"
        );
        assert_eq!(slug("`run-once(key)`"), "run-oncekey");
        assert_eq!(slug("Retention: `idem gc`"), "retention-idem-gc");
        assert_eq!(
            slug("Durability: `--sync normal|full`"),
            "durability---sync-normalfull"
        );
        assert_eq!(
            slug("Retries — `run_once_retry`"),
            "retries--run_once_retry"
        );
        assert_eq!(slug("See [the book](docs/README.md)"), "see-the-book");
        assert_eq!(
            slug("2026-12-05 (session 15): idem's protocol bare"),
            "2026-12-05-session-15-idems-protocol-bare"
        );
        assert_eq!(heading_text("## Title ##"), Some("Title"));
        assert_eq!(heading_text("#hashtag"), None);
        assert_eq!(heading_text("    # indented code"), None);
    }

    #[test]
    fn finds_missing_files_and_anchors_and_nothing_in_code() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "a.md",
            "# Title\n\
             \n\
             ## Keys, namespaces and reuse\n\
             ## Dup\n\
             ## Dup\n\
             \n\
             Good: [b](b.md), [b's section](b.md#section-two), [here](#keys-namespaces-and-reuse),\n\
             [the second Dup](#dup-1), [a folder](sub/), [code](sub/code.rs#L3),\n\
             [web](https://example.com/x.md), ![image](sub/img.png), [ref]\n\
             \n\
             [ref]: b.md#section-two\n\
             \n\
             Bad: [gone](missing.md) and [no section](b.md#nope)\n\
             and [a third Dup](#dup-2), ![no image](sub/none.png), [up](../../../etc/passwd).\n\
             \n\
             ```sh\n\
             [in a fence](fenced.md)\n\
             ```\n\
             Not links: `[in code](code.md)`, `` [a span\n\
             over two lines](two.md) ``, \\[escaped](esc.md).\n\
             [a link whose text\n\
             runs over a line](gone-too.md)\n\
             \n\
             [bad ref]: nothing.md\n",
        );
        write(
            root,
            "b.md",
            "# B\n\n## Section two\n\nBack to [a](./a.md#title).\n",
        );
        write(root, "sub/code.rs", "fn main() {}\n");
        write(root, "sub/img.png", "");
        let broken = broken_links(root);
        assert_eq!(
            broken,
            [
                "a.md:13: missing.md (no such file)",
                "a.md:13: b.md#nope (no heading #nope there)",
                "a.md:14: #dup-2 (no heading #dup-2 on this page)",
                "a.md:14: sub/none.png (no such file)",
                "a.md:14: ../../../etc/passwd (outside the repository)",
                "a.md:21: gone-too.md (no such file)",
                "a.md:24: nothing.md (no such file)",
            ],
            "{broken:#?}"
        );
    }

    #[test]
    fn finds_pages_missing_from_the_summary() {
        let dir = tempfile::tempdir().unwrap();
        let docs = dir.path();
        write(
            docs,
            "SUMMARY.md",
            "# Summary\n\n- [Intro](README.md)\n- [Ops](ops/service.md#top)\n",
        );
        write(docs, "README.md", "# Intro\n");
        write(docs, "ops/service.md", "# Top\n");
        write(docs, "ops/orphan.md", "# Orphan\n");
        assert_eq!(pages_missing_from_summary(docs), ["ops/orphan.md"]);
    }
}
