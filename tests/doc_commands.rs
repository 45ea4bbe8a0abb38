//! Every `nsq-dedupe` command line that the README and `docs/*.md` show, run as a reader would
//! type it: each one that needs no server exits 0 (or with the status its sentence gives, and
//! with the error text it quotes), and prints the output its console block shows. A command
//! that needs an nsqd (or would write outside the test's directories) is listed as skipped,
//! with the reason, and never counted as run.
//!
//! Where the commands come from: the lines of code blocks that start with `nsq-dedupe` (after
//! `$ ` in a console block; a `\` at the end continues a line; `cargo run --release --` stands
//! for the binary), and inline code that starts with `nsq-dedupe` or with a subcommand, joined
//! across line breaks. Inline code that only names something is checked for what it names:
//! `nsq-dedupe size` is a subcommand, `filter --max-age` and `filter --table-file FILE` a flag
//! of one, and a synopsis (`[--ways W]`) lists flags its subcommand has.
//!
//! How they run: through `sh -c`, as written, with `nsq-dedupe` on PATH from
//! `$HOME/.cargo/bin` (where the README's `cargo install` puts it), HOME a fresh directory, no
//! `NSQ_DEDUPE_*` variable set, and the working directory another fresh directory into which
//! the repository's files that the command names are first copied at the same relative path:
//! paths read as from the repository's root, and whatever a command writes (`seen.table`,
//! `--plot docs/catch-curve.svg`) lands in the copy. The commands of one code block share
//! their directories, in order. A comment that says `man PAGE` is checked with the system's
//! `man`, as the reader would run it after that command.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::docs::{pages, prose_lines};

/// The subcommands: inline code that starts with one of these is a command line too.
const SUBCOMMANDS: [&str; 6] = ["size", "filter", "run", "resize", "completions", "manpage"];

/// How long one documented command may take before it counts as hanging.
const LIMIT: Duration = Duration::from_secs(30);

/// Inputs the documentation names that the repository does not hold: the README's two days
/// of events, as overlapping lines `from..to` of the sample.
const INPUTS: [(&str, usize, usize); 2] = [("day1.ndjson", 0, 60), ("day2.ndjson", 40, 100)];

/// A command line as the documentation shows it.
struct Shown {
    /// `page:line`.
    place: String,
    /// The command with its continuations joined, without a shell comment.
    command: String,
    /// The shell comment after it, or "".
    comment: String,
    /// The output its console block shows, unless the block elides some with `...`.
    output: Option<String>,
    /// The exit status its sentence gives (else it must exit 0).
    status: Option<i32>,
    /// The error texts its sentence quotes (inline code starting with `error:`).
    errors: Vec<String>,
    /// The code block it is in: the commands of one block share their directories.
    block: Option<usize>,
    /// Whether it is written without `nsq-dedupe` (inline `size --max-age ...`).
    bare: bool,
}

/// What a documented command line is, and so how it is checked.
#[derive(Debug, PartialEq)]
enum Check {
    /// Run it.
    Run,
    /// `nsq-dedupe SUB` alone names a subcommand: `SUB --help` must succeed.
    Name(String),
    /// A subcommand's flags, named in prose or in a synopsis: each must be in `SUB --help`.
    Flags(String, Vec<String>),
    /// It needs a server that this test does not start: why.
    Skip(&'static str),
}

/// The fenced code blocks of a Markdown text: the line number of each one's first line, its
/// language and its lines.
fn fenced_blocks(text: &str) -> Vec<(usize, &str, Vec<&str>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, &str, Vec<&str>)> = None;
    for (index, line) in text.lines().enumerate() {
        match (line.trim_start().strip_prefix("```"), open.take()) {
            (Some(lang), None) => open = Some((index + 2, lang.trim(), Vec::new())),
            (Some(_), Some(block)) => blocks.push(block),
            (None, Some((start, lang, mut lines))) => {
                lines.push(line);
                open = Some((start, lang, lines));
            }
            (None, None) => {}
        }
    }
    blocks
}

/// A shell line without its comment (from the first unquoted `#` after white space), and the
/// comment.
fn split_comment(line: &str) -> (&str, &str) {
    let mut quote = None;
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if previous.is_whitespace() => return (&line[..at], &line[at + 1..]),
            _ => {}
        }
        previous = c;
    }
    (line, "")
}

/// The command a code line runs, if it runs `nsq-dedupe`; `cargo run ... --` becomes the binary.
fn binary_command(line: &str) -> Option<String> {
    let line = line.trim();
    if line == "nsq-dedupe" || line.starts_with("nsq-dedupe ") {
        return Some(line.to_owned());
    }
    let (cargo, args) = line.split_once(" -- ")?;
    cargo
        .starts_with("cargo run")
        .then(|| format!("nsq-dedupe {args}"))
}

/// The commands of a page's code blocks.
fn from_blocks(page: &str, text: &str, next_block: &mut usize, found: &mut Vec<Shown>) {
    for (first, lang, lines) in fenced_blocks(text) {
        let console = lang == "console";
        *next_block += 1;
        let mut at = 0;
        while at < lines.len() {
            let start = at;
            let line = if console {
                match lines[at].strip_prefix("$ ") {
                    Some(rest) => rest,
                    None => {
                        at += 1;
                        continue;
                    }
                }
            } else {
                lines[at]
            };
            let mut logical = line.trim_end().to_owned();
            while logical.ends_with('\\') && at + 1 < lines.len() {
                logical.pop();
                logical.truncate(logical.trim_end().len());
                at += 1;
                logical.push(' ');
                logical.push_str(lines[at].trim());
            }
            at += 1;
            let output = console.then(|| {
                let shown: Vec<&str> = lines[at..]
                    .iter()
                    .take_while(|line| !line.starts_with("$ "))
                    .copied()
                    .collect();
                at += shown.len();
                shown
            });
            let (command, comment) = split_comment(&logical);
            let Some(command) = binary_command(command) else {
                continue;
            };
            found.push(Shown {
                place: format!("{page}:{}", first + start),
                command,
                comment: comment.trim().to_owned(),
                output: output
                    .filter(|shown| !shown.iter().any(|line| line.trim() == "..."))
                    .map(|shown| shown.iter().map(|line| format!("{line}\n")).collect()),
                status: None,
                errors: Vec::new(),
                block: Some(*next_block),
                bare: false,
            });
        }
    }
}

/// A Markdown text cut into plain text and inline code, each piece with its byte offset:
/// `(is_code, offset, text)`. A span opens with a run of backticks and closes with the next
/// run of as many.
fn segments(prose: &str) -> Vec<(bool, usize, &str)> {
    let mut out = Vec::new();
    let (mut text_from, mut at) = (0, 0);
    let run_at = |at: usize| prose[at..].bytes().take_while(|&b| b == b'`').count();
    while at < prose.len() {
        if prose.as_bytes()[at] != b'`' {
            at += 1;
            continue;
        }
        let run = run_at(at);
        let body = at + run;
        let mut search = body;
        let close = loop {
            match prose[search..].find('`') {
                None => break None,
                Some(found) if run_at(search + found) == run => break Some(search + found),
                Some(found) => search += found + run_at(search + found),
            }
        };
        let Some(close) = close else {
            at = body;
            continue;
        };
        out.push((false, text_from, &prose[text_from..at]));
        out.push((true, body, &prose[body..close]));
        at = close + run;
        text_from = at;
    }
    out.push((false, text_from, &prose[text_from..]));
    out
}

/// What the rest of a command's sentence says of it: an exit status (`status N`) and the error
/// texts it quotes.
fn stated(after: &[(bool, usize, &str)]) -> (Option<i32>, Vec<String>) {
    let (mut status, mut errors) = (None, Vec::new());
    for &(code, _, text) in after {
        if code {
            let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            if text.starts_with("error:") {
                errors.push(text);
            }
            continue;
        }
        let end = [". ", ".\n", "\n\n"]
            .iter()
            .filter_map(|stop| text.find(stop))
            .min();
        let sentence = &text[..end.unwrap_or(text.len())];
        if let Some((_, rest)) = sentence.split_once("status ") {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            status = digits.parse().ok().or(status);
        }
        if end.is_some() || text.ends_with('.') {
            break;
        }
    }
    (status, errors)
}

/// The command lines of a page's inline code.
fn from_prose(page: &str, text: &str, found: &mut Vec<Shown>) {
    let lines: Vec<(usize, &str)> = prose_lines(text).collect();
    let prose = lines
        .iter()
        .map(|(_, line)| *line)
        .collect::<Vec<_>>()
        .join("\n");
    let pieces = segments(&prose);
    for (index, &(code, offset, span)) in pieces.iter().enumerate() {
        if !code {
            continue;
        }
        let words: Vec<&str> = span.split_whitespace().collect();
        let bare = match words.as_slice() {
            ["nsq-dedupe", _, ..] => false,
            [sub, flag, ..] if SUBCOMMANDS.contains(sub) && flag.starts_with('-') => true,
            _ => continue,
        };
        let (status, errors) = stated(&pieces[index + 1..]);
        let line = lines[prose[..offset].matches('\n').count()].0;
        found.push(Shown {
            place: format!("{page}:{line}"),
            command: words.join(" "),
            comment: String::new(),
            output: None,
            status,
            errors,
            block: None,
            bare,
        });
    }
}

/// Every command line of the README and `docs/*.md`, in page order.
fn shown_commands() -> Vec<Shown> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut blocks = 0;
    for (path, text) in pages() {
        let page = path.strip_prefix(root).unwrap().display().to_string();
        from_blocks(&page, &text, &mut blocks, &mut found);
        from_prose(&page, &text, &mut found);
    }
    found
}

/// Whether a word stands for a value the reader fills in (`FILE`, `DIR`, `FILE.svg`).
fn is_placeholder(word: &str) -> bool {
    let stem = word.split('.').next().unwrap_or("");
    !stem.is_empty() && stem.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

/// The long flags a text names, such as `--ways` in `[--ways W]`.
fn flags_in(text: &str) -> Vec<String> {
    text.match_indices("--")
        .map(|(at, _)| {
            let name: String = text[at + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            format!("--{name}")
        })
        .filter(|flag| flag.len() > 2)
        .collect()
}

/// How a documented command line is checked.
fn check_of(shown: &Shown) -> Check {
    let words: Vec<&str> = shown.command.split_whitespace().collect();
    let args = if shown.bare { &words[..] } else { &words[1..] };
    let sub = args.first().copied().unwrap_or("");
    let asks = args
        .iter()
        .any(|a| matches!(*a, "--help" | "-h" | "--version" | "-V"));
    if args.iter().any(|a| a.starts_with('[')) {
        return Check::Flags(sub.into(), flags_in(&shown.command));
    }
    if args.len() == 1 && SUBCOMMANDS.contains(&sub) {
        return Check::Name(sub.into());
    }
    let names_a_flag =
        args.len() == 2 || (args.len() == 3 && is_placeholder(args[2]) && !args[2].contains('/'));
    if shown.bare && !asks && names_a_flag && args[1].starts_with("--") {
        return Check::Flags(sub.into(), vec![args[1].into()]);
    }
    // `run` ends by itself only on an error, which its sentence then states.
    if sub == "run" && !asks && shown.status.is_none() {
        return Check::Skip("`run` consumes from nsqd: needs a running nsqd");
    }
    if sub == "resize" && !asks && shown.status.is_none() {
        return Check::Skip("`resize` changes a table in Redis: needs a running Redis");
    }
    if sub == "size" && args.contains(&"--nsqd-http-address") {
        return Check::Skip("measures the rate on a running nsqd");
    }
    if args
        .windows(2)
        .any(|w| w[0] == ">" && w[1].starts_with('/'))
    {
        return Check::Skip("writes outside the test's directories");
    }
    Check::Run
}

/// The commands a command line stands for: one per alternative of a word such as
/// `bash|zsh|fish`.
fn alternatives(command: &str) -> Vec<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let Some(at) = words.iter().position(|w| {
        w.contains('|')
            && w.split('|')
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric()))
    }) else {
        return vec![command.to_owned()];
    };
    words[at]
        .split('|')
        .map(|choice| {
            let mut one = words.clone();
            one[at] = choice;
            one.join(" ")
        })
        .collect()
}

/// A reader's machine: a HOME with the binary where `cargo install` puts it, and a working
/// directory.
struct Machine {
    home: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Machine {
    fn new() -> Machine {
        let home = tempfile::tempdir().unwrap();
        let bin = home.path().join(".cargo/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(
            assert_cmd::cargo::cargo_bin("nsq-dedupe"),
            bin.join("nsq-dedupe"),
        )
        .unwrap();
        Machine {
            home,
            work: tempfile::tempdir().unwrap(),
        }
    }

    /// PATH as after the README's install: `~/.cargo/bin` first.
    fn path(&self, rest: &str) -> String {
        format!("{}/.cargo/bin:{rest}", self.home.path().display())
    }

    /// Copies into the working directory the repository's files that `command` names, and the
    /// inputs of [`INPUTS`] it names, unless they are there already.
    fn provide_inputs(&self, command: &str) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for word in command.split_whitespace() {
            let word = word.trim_start_matches('>').trim_matches(['\'', '"']);
            let target = self.work.path().join(word);
            if word.is_empty() || word.starts_with(['-', '/', '~']) || target.exists() {
                continue;
            }
            let source = root.join(word);
            if source.is_file() {
                std::fs::create_dir_all(target.parent().unwrap()).unwrap();
                std::fs::copy(&source, &target).unwrap();
            } else if let Some(&(_, from, to)) = INPUTS.iter().find(|(name, ..)| *name == word) {
                let sample =
                    std::fs::read_to_string(root.join("tests/data/sample.ndjson")).unwrap();
                let lines: Vec<&str> = sample.lines().collect();
                std::fs::write(&target, lines[from..to].join("\n") + "\n").unwrap();
            }
        }
    }

    /// Runs `command` with `sh -c` here: its status (`None` when it ran past [`LIMIT`] and was
    /// killed), stdout and stderr.
    fn execute(&self, command: &str) -> (Option<i32>, String, String) {
        self.provide_inputs(command);
        let out = self.home.path().join(".command.out");
        let err = self.home.path().join(".command.err");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(self.work.path())
            .env_clear()
            .env("HOME", self.home.path())
            .env(
                "PATH",
                self.path(&std::env::var("PATH").unwrap_or_default()),
            )
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.code();
            }
            if Instant::now() > deadline {
                // The whole group: sh and what it started.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let read =
            |path: &Path| String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
        (status, read(&out), read(&err))
    }

    /// Where the system's `man` finds `page` on this machine, or why it cannot be asked.
    fn man(&self, page: &str) -> Result<Option<PathBuf>, String> {
        let out = Command::new("man")
            .args(["-w", page])
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", self.path("/usr/local/bin:/usr/bin:/bin"))
            .output()
            .map_err(|e| format!("`man` cannot be run ({e})"))?;
        Ok(out
            .status
            .success()
            .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())))
    }
}

/// The page a shell comment tells the reader to read next: "then `man PAGE`".
fn man_page_named(comment: &str) -> Option<&str> {
    let (_, rest) = comment.split_once("`man ")?;
    rest.split('`').next()
}

/// Runs one documented command on `machine` and checks what its text promises; returns what
/// it found, or what is wrong.
fn run_checked(shown: &Shown, command: &str, machine: &Machine) -> Result<String, String> {
    let (status, stdout, stderr) = machine.execute(command);
    let Some(code) = status else {
        return Err(format!("still running after {LIMIT:?}; killed"));
    };
    let expected = shown.status.unwrap_or(0);
    if code != expected {
        return Err(format!(
            "exits with {code}, the text says {expected}; stderr:\n{stderr}"
        ));
    }
    if let Some(output) = &shown.output {
        if &stdout != output {
            return Err(format!(
                "prints other output than shown:\n{stdout}\nshown:\n{output}"
            ));
        }
    }
    for error in &shown.errors {
        if !stderr.contains(error.as_str()) {
            return Err(format!("does not print {error:?}; stderr:\n{stderr}"));
        }
    }
    let mut found = format!("ran, status {code}");
    if let Some(page) = man_page_named(&shown.comment) {
        match machine.man(page) {
            Err(why) => found += &format!("; `man {page}` not checked: {why}"),
            Ok(Some(file)) if file.starts_with(machine.home.path()) => {
                found += &format!("; `man {page}` finds it");
            }
            Ok(other) => {
                return Err(format!(
                    "the comment says `man {page}`, but man finds {other:?}, not the page written"
                ))
            }
        }
    }
    Ok(found)
}

#[test]
fn every_documented_command_runs_as_the_text_says() {
    let shown = shown_commands();
    let mut helps: HashMap<String, String> = HashMap::new();
    let mut help = |sub: &str| -> Option<String> {
        let text = helps.entry(sub.to_owned()).or_insert_with(|| {
            let out = crate::util::bin().args([sub, "--help"]).output().unwrap();
            if out.status.success() {
                String::from_utf8_lossy(&out.stdout).into_owned()
            } else {
                String::new()
            }
        });
        (!text.is_empty()).then(|| text.clone())
    };
    let mut machines: HashMap<usize, Machine> = HashMap::new();
    let (mut ran, mut named, mut skipped, mut wrong) = (0, 0, 0, Vec::new());
    for shown in &shown {
        let outcome = match check_of(shown) {
            Check::Skip(why) => {
                skipped += 1;
                Ok(format!("SKIPPED ({why})"))
            }
            Check::Name(sub) => {
                named += 1;
                help(&sub)
                    .map(|_| "names a subcommand".to_owned())
                    .ok_or_else(|| format!("`{sub}` is not a subcommand"))
            }
            Check::Flags(sub, flags) => {
                named += 1;
                let listed = help(&sub).unwrap_or_default();
                let missing: Vec<&String> = flags
                    .iter()
                    .filter(|flag| {
                        !listed
                            .lines()
                            .filter(|line| line.trim_start().starts_with('-'))
                            .flat_map(|line| line.split([' ', ',']))
                            .any(|word| word == flag.as_str())
                    })
                    .collect();
                if missing.is_empty() && !flags.is_empty() {
                    Ok(format!("names flags of `{sub}`"))
                } else {
                    Err(format!("`{sub} --help` lists no {missing:?}"))
                }
            }
            Check::Run => {
                let mut results = Vec::new();
                for command in alternatives(&shown.command) {
                    let command = if shown.bare {
                        format!("nsq-dedupe {command}")
                    } else {
                        command
                    };
                    let fresh;
                    let machine = match shown.block {
                        Some(block) => machines.entry(block).or_insert_with(Machine::new),
                        None => {
                            fresh = Machine::new();
                            &fresh
                        }
                    };
                    ran += 1;
                    let named = if command == shown.command {
                        String::new()
                    } else {
                        format!("as `{command}`: ")
                    };
                    results.push(run_checked(shown, &command, machine).map_err(|why| named + &why));
                }
                results
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()
                    .map(|found| found.join("; "))
            }
        };
        match outcome {
            Ok(found) => println!("{}: {found}: {}", shown.place, shown.command),
            Err(why) => {
                println!("{}: WRONG: {}", shown.place, shown.command);
                wrong.push(format!("{}: `{}`: {why}", shown.place, shown.command));
            }
        }
    }
    println!("{ran} commands run, {named} names and flags checked, {skipped} skipped");
    assert!(
        wrong.is_empty(),
        "documented commands that do not do what the text says:\n{}",
        wrong.join("\n")
    );
    assert!(ran >= 15, "only {ran} documented commands run");
}

#[test]
fn command_lines_are_read_as_the_text_writes_them() {
    let text = "Run `nsq-dedupe run --max-in-flight 0`: it exits with status 2 and\n\
                ``error: invalid `x` = 0``. Later `filter --table-file FILE`, a `size --plot` and\n\
                `nsq-dedupe size\n--rate 5 --window 1s -p 0.5`; `size` alone is a word.\n\
                ```sh\nnsq-dedupe completions bash|zsh   # then `man nsq-dedupe-run`\n\
                cargo run --release -- filter --key json:/id \\\n  a.ndjson\n```\n\
                ```console\n$ nsq-dedupe --version\nnsq-dedupe 0.1.0\n...\n```\n";
    let mut found = Vec::new();
    from_blocks("p", text, &mut 0, &mut found);
    from_prose("p", text, &mut found);
    let read: Vec<(&str, &str, Option<i32>, Check)> = found
        .iter()
        .map(|s| (s.place.as_str(), s.command.as_str(), s.status, check_of(s)))
        .collect();
    assert_eq!(
        read,
        [
            ("p:6", "nsq-dedupe completions bash|zsh", None, Check::Run),
            (
                "p:7",
                "nsq-dedupe filter --key json:/id a.ndjson",
                None,
                Check::Run
            ),
            ("p:11", "nsq-dedupe --version", None, Check::Run),
            (
                "p:1",
                "nsq-dedupe run --max-in-flight 0",
                Some(2),
                Check::Run
            ),
            (
                "p:2",
                "filter --table-file FILE",
                None,
                Check::Flags("filter".into(), vec!["--table-file".into()])
            ),
            (
                "p:2",
                "size --plot",
                None,
                Check::Flags("size".into(), vec!["--plot".into()])
            ),
            (
                "p:3",
                "nsq-dedupe size --rate 5 --window 1s -p 0.5",
                None,
                Check::Run
            ),
        ]
    );
    assert_eq!(found[0].comment, "then `man nsq-dedupe-run`");
    assert_eq!(man_page_named(&found[0].comment), Some("nsq-dedupe-run"));
    assert_eq!(found[2].output, None, "an elided output is not compared");
    assert_eq!(found[3].errors, ["error: invalid `x` = 0"]);
    assert_eq!(
        alternatives("nsq-dedupe completions bash|zsh"),
        ["nsq-dedupe completions bash", "nsq-dedupe completions zsh"]
    );
    let synopsis = Shown {
        command: "nsq-dedupe filter [--ways W] [--key body|json:/ptr] [FILE...]".into(),
        ..found.remove(0)
    };
    assert_eq!(
        check_of(&synopsis),
        Check::Flags("filter".into(), vec!["--ways".into(), "--key".into()])
    );
    let service = Shown {
        command: "nsq-dedupe run --config c.toml".into(),
        ..synopsis
    };
    assert!(matches!(check_of(&service), Check::Skip(_)));
}
