//! `nsq-dedupe size`: exact output for the documented examples, and bad input.

use predicates::prelude::*;

use crate::util::bin;

#[test]
fn classic_table_for_an_hour_at_a_thousand_per_second() {
    let out = text(&[
        "--probability",
        "0.9",
        "--rate",
        "1000",
        "--window",
        "1h",
        "--ways",
        "1",
    ]);
    assert_eq!(
        out,
        "\
Table:        34,168,399 buckets (one bucket per set, the classic table)
Memory:       260.7 MiB in-process; about 341.1 MiB in Memcached, 379.8 MiB in Redis or Valkey
Window:       1h at 1000 msg/s = 3,600,000 distinct messages
Probability:  0.900000 that a copy arriving a whole window late is caught

Delay           Messages later  Catch probability
1s                       1,000  0.999971
1m                      60,000  0.998246
10m                    600,000  0.982593
1h                   3,600,000  0.900000
2h                   7,200,000  0.810000

Resizing:     to twice this size (68,336,798 buckets, by `nsq-dedupe resize` or a table file of another size), this table stays, read-only, beside the new one: memory peaks at 782.1 MiB in-process; about 1023.4 MiB in Memcached, 1.1 GiB in Redis or Valkey.
              It is read until the new table has taken 68,336,798 new messages (18h58m57s at 1000 msg/s); each claim meanwhile reads it too, one look-up more (one set in process; one key, in the same round trip, in a shared store).
"
    );
}

#[test]
fn the_often_quoted_size_catches_one_copy_in_ten_an_hour_late() {
    bin()
        .args([
            "size",
            "--buckets",
            "1563461",
            "--ways",
            "1",
            "--rate",
            "1000",
        ])
        .args(["--window", "1h"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "Probability:  0.100000 that a copy arriving a whole window late is caught",
        ));
}

/// What `size ARGS` prints.
pub(crate) fn text(args: &[&str]) -> String {
    let out = bin().arg("size").args(args).assert().success();
    String::from_utf8(out.get_output().stdout.clone()).expect("size prints UTF-8")
}

/// `size ARGS --json`, parsed.
pub(crate) fn json(args: &[&str]) -> serde_json::Value {
    let out = bin()
        .arg("size")
        .args(args)
        .arg("--json")
        .assert()
        .success();
    serde_json::from_slice(&out.get_output().stdout).expect("size --json prints JSON")
}

#[test]
fn json_gives_buckets_probability_window_and_memory() {
    let v = json(&["-p", "0.9", "--rate", "1000", "--window", "1h"]);
    assert_eq!(v["buckets"], 6_185_416);
    assert_eq!(v["ways"], 8);
    // The table reaches at least the target; the smallest such table overshoots it a little.
    assert_eq!(v["target_probability"], 0.9);
    let achieved = v["probability"].as_f64().unwrap();
    assert!((0.9..0.900001).contains(&achieved), "{achieved}");
    assert_eq!(v["window_messages"], 3_600_000.0);
    assert_eq!(v["window_seconds"], 3600.0);
    assert_eq!(v["memory_bytes"], 6_185_416 * 8);
    let v = json(&[
        "-p", "0.99", "--rate", "1000", "--window", "1h", "--ways", "1",
    ]);
    assert_eq!(v["buckets"], 358_196_986);
    let v = json(&["-p", "0.99", "--rate", "1000", "--window", "1h"]);
    assert_eq!(v["buckets"], 9_910_168);
}

#[test]
fn solves_each_quantity_from_the_other_two() {
    // Window from size and probability, then back.
    let v = json(&["--buckets", "6185416", "-p", "0.9", "--rate", "1000"]);
    let seconds = v["window_seconds"].as_f64().unwrap();
    assert!((3599.0..3601.0).contains(&seconds), "{seconds}");
    // Probability from size and a message count; no rate, so no seconds.
    let v = json(&["--buckets", "6185416", "--messages", "3600000"]);
    let p = v["probability"].as_f64().unwrap();
    assert!((0.9..0.90001).contains(&p), "{p}");
    assert!(v.get("window_seconds").is_none());
    // Memory budget: 64 MiB of 8-byte slots.
    let v = json(&["--memory", "64MiB", "--messages", "1000000"]);
    assert_eq!(v["buckets"], 8 * 1024 * 1024);
}

#[test]
fn bad_input_names_the_flag_and_the_accepted_form() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["-p", "1.5", "--rate", "1000", "--window", "1h"],
            "invalid value '1.5' for '--probability <P>': expected a probability between 0 and 1 exclusive, such as 0.99",
        ),
        (
            &["-p", "0", "--rate", "1000", "--window", "1h"],
            "invalid value '0' for '--probability <P>'",
        ),
        (
            &["-p", "0.9", "--rate", "0", "--window", "1h"],
            "invalid value '0' for '--rate <MSG/S>': expected messages per second greater than 0",
        ),
        (
            &["-p", "0.9", "--rate", "10", "--window", "an hour"],
            "invalid value 'an hour' for '--window <DURATION>': expected a duration such as 30s, 5m, 1h or 2d",
        ),
        (
            &["--buckets", "1000", "--window", "1h"],
            "`--window 1h` needs `--rate` (distinct messages per second)",
        ),
        (&["-p", "0.9"], "give exactly two of `--probability`, the table size"),
        (
            &["-p", "0.9", "--buckets", "100", "--messages", "10"],
            "give exactly two of",
        ),
        (
            &["--buckets", "0", "--messages", "10"],
            "invalid value '0' for '--buckets <N>': expected a whole number of slots of at least 1",
        ),
        (
            &["--buckets", "64", "--messages", "10", "--ways", "3"],
            "invalid value '3' for '--ways <W>': expected 1, 2, 4 or 8",
        ),
        (
            &["--memory", "12 parsecs", "--messages", "10"],
            "invalid value '12 parsecs' for '--memory <SIZE>': expected a size such as 64MiB",
        ),
    ];
    refused(cases);
}

/// Runs `size` with each case's arguments: it fails, prints nothing on stdout, and its
/// stderr says the case's message.
pub(crate) fn refused(cases: &[(&[&str], &str)]) {
    for (args, message) in cases {
        bin()
            .arg("size")
            .args(*args)
            .assert()
            .failure()
            .stdout("")
            .stderr(predicate::str::contains(*message));
    }
}

#[test]
fn a_max_age_shorter_than_the_window_gives_the_probability_it_leaves() {
    // A copy a whole window late is past max age: the probability printed is the one it has,
    // 0, not the table's alone, which is given beside it.
    let out = text(&[
        "--window",
        "1h",
        "--rate",
        "100",
        "--probability",
        "0.99",
        "--max-age",
        "30m",
    ]);
    assert!(
        out.contains(
            "Probability:  0 that a copy arriving a whole window late is caught: max age 30m is \
             shorter than the window, and such a copy passes whatever the table holds (the table \
             alone would catch it with probability 0.990000)\n"
        ),
        "{out}"
    );
}

#[test]
fn max_age_cuts_the_curve_and_suggests_the_table_it_makes_enough() {
    let json = json(&[
        "--buckets",
        "1000000",
        "--rate",
        "100",
        "--window",
        "1h",
        "--max-age",
        "30m",
    ]);
    let geometry = nsq_dedupe::Geometry::new(1_000_000, 8).unwrap();
    let delays = json["delays"].as_array().unwrap();
    assert!(delays.len() >= 4, "{json}");
    let mut seen_cut = (false, false);
    for row in delays {
        let seconds = row["delay_seconds"].as_f64().unwrap();
        let messages = row["messages"].as_f64().unwrap();
        let probability = row["probability"].as_f64().unwrap();
        if seconds <= 1800.0 {
            seen_cut.0 |= seconds == 1800.0;
            let direct = nsq_dedupe::sizing::catch_probability(geometry, messages);
            assert!((probability - direct).abs() < 1e-12, "{row}");
        } else {
            seen_cut.1 |= seconds == 1801.0;
            assert_eq!(probability, 0.0, "{row}");
        }
    }
    assert_eq!(
        seen_cut,
        (true, true),
        "rows at max_age and a second later: {json}"
    );
    let suggested = nsq_dedupe::sizing::slots_for(0.99, 8, 1800.0 * 100.0).unwrap();
    assert_eq!(json["max_age_seconds"], 1800.0);
    assert_eq!(json["max_age_table"]["buckets"], suggested.slots());
    assert_eq!(
        json["max_age_table"]["memory_bytes"],
        suggested.memory_bytes() * 2
    );
    bin()
        .args([
            "size",
            "-p",
            "0.9",
            "--messages",
            "1000",
            "--max-age",
            "10m",
        ])
        .assert()
        .code(1)
        .stderr(
            "error: `--max-age 10m` needs `--rate` (distinct messages per second) to tell how \
             many messages arrive within it\n",
        );
}

/// What `size` prints as the memory can be typed back as `--memory`, in PiB as in MiB: the
/// table it gives is the same within the print's rounding.
#[test]
fn the_memory_size_prints_can_be_typed_back() {
    let window = ["--rate", "100000000", "--window", "30d"];
    let out = text(&[["-p", "0.99"].as_slice(), &window].concat());
    let memory = out
        .lines()
        .find_map(|line| line.strip_prefix("Memory:"))
        .and_then(|rest| rest.trim().split(" in-process").next())
        .unwrap_or_else(|| panic!("no memory in\n{out}"));
    assert!(memory.ends_with(" PiB"), "{out}");
    let json = json(&[["--memory", memory].as_slice(), &window].concat());
    let probability = json["probability"].as_f64().unwrap();
    assert!((0.98..=0.995).contains(&probability), "{memory}: {json}");
}

/// The README's picture: `size --plot` with these flags writes `docs/catch-curve.svg`.
const README_PLOT: [&str; 7] = [
    "size",
    "--probability",
    "0.99",
    "--rate",
    "1000",
    "--window",
    "1h",
];

/// Runs `size` with `args` and `--plot` into a temporary file; returns the SVG.
fn plot(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("curve.svg");
    bin().args(args).arg("--plot").arg(&path).assert().success();
    std::fs::read_to_string(&path).unwrap()
}

/// The curves of a plot: each long polyline's points, as pixel coordinates.
fn curves(svg: &str) -> Vec<Vec<(f64, f64)>> {
    let document = roxmltree::Document::parse(svg).expect("the plot is well-formed XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    document
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .map(|n| {
            n.attribute("points")
                .unwrap()
                .split_whitespace()
                .map(|pair| {
                    let (x, y) = pair.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect::<Vec<(f64, f64)>>()
        })
        // Grid lines, ticks, dashes and legend samples have a few points; curves have hundreds.
        .filter(|points| points.len() > 100)
        .collect()
}

#[test]
fn plot_draws_one_falling_curve_per_way_count() {
    let svg = plot(&README_PLOT);
    let curves = curves(&svg);
    assert_eq!(curves.len(), 4, "one curve per way count (1, 2, 4, 8)");
    for curve in &curves {
        // Later copies are caught less often: y (pixels, downwards) never goes up as x grows.
        assert!(curve
            .windows(2)
            .all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1));
    }
    for label in ["1 way (classic)", "2 ways", "4 ways", "8 ways (chosen)"] {
        assert!(svg.contains(label), "no legend entry {label:?}");
    }
    assert!(svg.contains("the dot: caught with 0.990000 a whole window (1h) late"));
    assert!(svg.contains("75.6 MiB table"));
}

#[test]
fn plot_in_messages_without_a_rate_and_cut_at_max_age() {
    let svg = plot(&[
        "size",
        "--buckets",
        "1000000",
        "--messages",
        "500000",
        "--ways",
        "2",
    ]);
    assert_eq!(curves(&svg).len(), 4);
    assert!(svg.contains("2 ways (chosen)") && svg.contains("(500,000 messages)"));

    let svg = plot(&[
        "size",
        "--memory",
        "64MiB",
        "--rate",
        "1000",
        "--window",
        "1h",
        "--max-age",
        "10m",
    ]);
    let curves = curves(&svg);
    assert_eq!(curves.len(), 4);
    // Past max_age every curve lies on the x axis: the same bottom y for its last points.
    let bottom = curves
        .iter()
        .map(|c| c.last().unwrap().1)
        .fold(f64::MIN, f64::max);
    assert!(curves.iter().all(|c| c.last().unwrap().1 == bottom));
    assert!(svg.contains("later than max age (10m): passes"));
    assert!(svg.contains("caught with 0.000000 a whole window (1h) late"));
}

#[test]
fn the_readme_picture_is_what_size_plot_draws() {
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/catch-curve.svg"),
    )
    .unwrap();
    assert!(
        plot(&README_PLOT) == committed,
        "docs/catch-curve.svg is stale: regenerate it with `nsq-dedupe {} --plot docs/catch-curve.svg`",
        README_PLOT.join(" ")
    );
}

#[test]
fn plot_into_a_missing_directory_is_an_error_naming_the_file() {
    bin()
        .args(README_PLOT)
        .args(["--plot", "/nonexistent/dir/curve.svg"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "error: cannot write the plot to /nonexistent/dir/curve.svg",
        ));
}

/// The plot is SVG whatever the file is called: a name that does not end in .svg (in any case)
/// would make a `.png` that no viewer opens, so it is refused, with the name to use, before
/// anything is written.
#[test]
fn a_plot_file_not_named_svg_is_refused_with_the_name_to_use() {
    let dir = tempfile::tempdir().unwrap();
    for (name, instead) in [
        ("p.png", "p.svg"),
        ("curve", "curve.svg"),
        ("curve.svgz", "curve.svg"),
        ("svg", "svg.svg"),
    ] {
        let path = dir.path().join(name);
        let typed = path.to_str().unwrap();
        let instead = dir.path().join(instead);
        bin()
            .args(README_PLOT)
            .args(["--plot", typed])
            .assert()
            .code(2)
            .stdout("")
            .stderr(format!(
                "error: invalid value '{typed}' for '--plot <FILE.svg>': the plot is an SVG \
                 picture; give a file name ending in .svg, such as {}\n\nFor more \
                 information, try '--help'.\n",
                instead.display()
            ));
        assert!(!path.exists(), "{name} was written");
    }
    for name in ["p.SVG", "p.Svg"] {
        let path = dir.path().join(name);
        bin()
            .args(README_PLOT)
            .arg("--plot")
            .arg(&path)
            .assert()
            .success();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.starts_with("<svg"),
            "{name}: {}",
            &svg[..40.min(svg.len())]
        );
    }
}

#[test]
fn a_table_without_max_age_says_nothing_of_max_age() {
    let out = bin()
        .args([
            "size",
            "--buckets",
            "1024",
            "--rate",
            "1000",
            "--window",
            "1h",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("max age"), "{text}");
    let hour = text.lines().find(|l| l.starts_with("1h ")).unwrap();
    assert!(hour.ends_with("  0.000000"), "{text}");
}

#[test]
fn probabilities_just_below_one_print_alike_whatever_the_window() {
    for messages in ["1000", "10000", "100000"] {
        let out = bin()
            .args(["size", "--memory", "64MiB", "--messages", messages])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8(out.stdout).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("Probability:"))
            .unwrap();
        assert_eq!(
            line,
            "Probability:  > 0.999999999999 that a copy arriving a whole window late is caught",
            "{messages}"
        );
    }
    // Fewer later messages than a set holds beside the entry: certain.
    let out = bin()
        .args(["size", "--memory", "64MiB", "--messages", "7"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("Probability:  1 that a copy arriving a whole window late is caught\n"),
        "{text}"
    );
}

/// A window of centuries reads in days, and the delay table's columns stay apart however
/// wide its figures are.
#[test]
fn a_window_of_centuries_reads_in_days_and_keeps_its_columns_apart() {
    let out = bin()
        .args([
            "size",
            "--memory",
            "1PiB",
            "--probability",
            "0.99",
            "--rate",
            "1000",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "Window:       591722d at 1000 msg/s = 51,124,761,526,272 distinct messages\n"
        ),
        "{text}"
    );
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Delay"))
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(rows.len(), 10, "{text}");
    for row in &rows {
        let columns: Vec<&str> = row.split("  ").filter(|c| !c.trim().is_empty()).collect();
        assert_eq!(columns.len(), 3, "{row:?} in\n{text}");
    }
    assert!(
        rows.contains(&"591722d        51,124,761,526,272  0.990000"),
        "{text}"
    );
}
