//! `nsq-dedupe size` on what growing a table costs: a resize's peak memory and extra read, a
//! table that sizes itself (where it starts, how it grows, its ceiling), and the memory and
//! probability of a table with `--max-age`; text and JSON give the same figures.

use crate::cli_size::{json, refused};
use crate::util::bin;

fn text(args: &[&str]) -> String {
    let out = bin().arg("size").args(args).assert().success();
    String::from_utf8(out.get_output().stdout.clone()).unwrap()
}

#[test]
fn a_probability_and_a_window_without_a_rate_describe_the_table_that_sizes_itself() {
    let args = ["-p", "0.99", "--window", "30s", "--max-memory", "64MiB"];
    assert_eq!(
        text(&args),
        "\
Table:        sizes itself (no rate and no size given): starts at 2,816 buckets (352 sets of 8 ways), room for 1,024 distinct messages a window
Memory:       at the start, 22.0 KiB in-process; about 26.4 KiB in Memcached, 32.1 KiB in Redis or Valkey
Window:       30s at the rate the table meets
Probability:  0.990000 that a copy arriving a whole window late is caught, the target it grows for

Growing:      every 250ms, the distinct rate of the last 1s (for a shared table, the larger of the fleet's and this consumer's over 500ms divided by its share of the fleet) is checked against the table; when a copy one window late would be caught with less than 0.990000, a new generation takes the new messages, sized for 2 times that rate.
              The previous generation stays, read-only, until the new one has taken as many new messages as it has buckets (or max age has passed): memory peaks at both generations, and each claim reads the previous one too, one look-up more (one set in process; one key, in the same round trip, in a shared store).
Ceiling:      64.0 MiB in-process for every generation held at once (`--max-memory`).
              A table of all of it, 8,388,608 buckets, catches a copy one window late with probability 0.990000 up to 101,575 distinct messages a second; the largest one reached is smaller, at least half of it, as the generations before it are held beside it until they retire.
"
    );
    let v = json(&args);
    assert_eq!(v["sizes_itself"], true);
    assert_eq!(v["buckets"], 2816);
    assert_eq!(v["memory_bytes"], 2816 * 8);
    assert_eq!(v["target_probability"], 0.99);
    assert_eq!(v["window_seconds"], 30.0);
    let s = &v["self_sizing"];
    assert_eq!(s["start_buckets"], 2816);
    assert_eq!(s["start_messages"], 1024.0);
    assert_eq!(s["check_interval_seconds"], 0.25);
    assert_eq!(s["rate_span_seconds"], 1.0);
    assert_eq!(s["shared_rate_span_seconds"], 0.5);
    assert_eq!(s["growth_factor"], 2.0);
    assert_eq!(s["max_memory_bytes"], 64 << 20);
    assert_eq!(s["max_memory_default"], false);
    assert_eq!(s["ceiling_buckets"], 8_388_608);
    assert_eq!(s["ceiling_rate"].as_f64().unwrap().floor(), 101_575.0);
    assert_eq!(s["extra_reads_per_claim_while_growing"], 1);
    // The ceiling's table meets the target at the rate said, and not much above it.
    let ceiling = nsq_dedupe::Geometry::new(8_388_608, 8).unwrap();
    let at = |rate: f64| nsq_dedupe::sizing::catch_probability(ceiling, rate * 30.0);
    assert!(at(101_575.0) >= 0.99 && at(101_700.0) < 0.99);
}

#[test]
fn a_ceiling_below_the_first_table_is_what_it_starts_at_and_says_so() {
    let out = text(&["-p", "0.99", "--window", "30s", "--max-memory", "1KiB"]);
    assert!(
        out.starts_with(
            "Table:        sizes itself (no rate and no size given): starts at 128 buckets (16 \
             sets of 8 ways), all the ceiling holds (1,024 distinct messages a window would \
             need 2,816 buckets)\n"
        ),
        "{out}"
    );
    // One way: the classic table, as a table of fixed size says it.
    let out = text(&["-p", "0.99", "--window", "30s", "--ways", "1"]);
    assert!(
        out.starts_with(
            "Table:        sizes itself (no rate and no size given): starts at 101,888 buckets \
             (one bucket per set, the classic table), room for 1,024 distinct messages a window\n"
        ),
        "{out}"
    );
}

#[test]
fn without_max_memory_the_default_ceiling_is_named() {
    let out = text(&["-p", "0.99", "--window", "30s"]);
    assert!(
        out.contains(
            "in-process for every generation held at once (the default: a quarter of this \
             machine's memory, at most 1 GiB; `--max-memory` sets it).\n"
        ),
        "{out}"
    );
    let v = json(&["-p", "0.99", "--window", "30s"]);
    assert_eq!(v["self_sizing"]["max_memory_default"], true);
    let ceiling = v["self_sizing"]["max_memory_bytes"].as_u64().unwrap();
    assert!(ceiling > 0 && ceiling <= 1 << 30, "{v}");
    // With max age every slot carries a time: twice the memory, at the start and under the ceiling.
    let timed = json(&[
        "-p",
        "0.99",
        "--window",
        "30s",
        "--max-memory",
        "64MiB",
        "--max-age",
        "1m",
    ]);
    assert_eq!(timed["memory_bytes"], 2816 * 16);
    assert_eq!(timed["self_sizing"]["ceiling_buckets"], 4_194_304);
}

#[test]
fn a_table_of_fixed_size_says_what_growing_it_to_twice_costs() {
    let out = text(&["--probability", "0.99", "--rate", "1000", "--window", "1h"]);
    assert!(
        out.ends_with(
            "\n\nResizing:     to twice this size (19,820,336 buckets, by `nsq-dedupe resize` or \
             a table file of another size), this table stays, read-only, beside the new one: \
             memory peaks at 226.8 MiB in-process; about 272.0 MiB in Memcached, 330.5 MiB in \
             Redis or Valkey.\n              It is read until the new table has taken 19,820,336 new \
             messages (5h30m20s at 1000 msg/s); each claim meanwhile reads it too, one look-up \
             more (one set in process; one key, in the same round trip, in a shared store).\n"
        ),
        "{out}"
    );
    let v = json(&["--probability", "0.99", "--rate", "1000", "--window", "1h"]);
    let r = &v["resize"];
    assert_eq!(r["to_buckets"], 19_820_336);
    assert_eq!(r["peak_memory_bytes"], (9_910_168 + 19_820_336) * 8);
    let old = nsq_dedupe::Geometry::new(9_910_168, 8).unwrap();
    let new = nsq_dedupe::Geometry::new(19_820_336, 8).unwrap();
    assert_eq!(
        r["peak_memcached_bytes_estimate"],
        nsq_dedupe::sizing::memcached_bytes_estimate(old)
            + nsq_dedupe::sizing::memcached_bytes_estimate(new)
    );
    assert_eq!(
        r["peak_redis_bytes_estimate"],
        nsq_dedupe::sizing::redis_bytes_estimate(old)
            + nsq_dedupe::sizing::redis_bytes_estimate(new)
    );
    assert_eq!(r["previous_read_messages"], 19_820_336);
    assert_eq!(r["previous_read_seconds"], 19_820.336);
    assert_eq!(r["extra_reads_per_claim"], 1);
}

#[test]
fn max_age_counts_its_times_in_the_memory_and_text_and_json_give_one_probability() {
    let args = [
        "-p",
        "0.99",
        "--rate",
        "100",
        "--window",
        "1h",
        "--max-age",
        "30m",
    ];
    let out = text(&args);
    // 991,016 buckets: 16 bytes each in process, 12 an entry in Memcached and in Redis.
    assert!(
        out.contains(
            "Memory:       15.1 MiB in-process; about 12.8 MiB in Memcached, 14.8 MiB in Redis or Valkey\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "Probability:  0 that a copy arriving a whole window late is caught: max age 30m"
        ),
        "{out}"
    );
    let v = json(&args);
    assert_eq!(v["buckets"], 991_016);
    assert_eq!(v["memory_bytes"], 991_016 * 16);
    // 123,877 sets of 8 ways, 8 sets a key with entries of 12 bytes: 15,484 keys of 780 bytes
    // (896 allocated), and one of 5 sets (489 bytes, 512 allocated), each key 88 bytes more
    // and its slot in the dictionary 18.
    assert_eq!(
        v["redis_bytes_estimate"],
        15_484 * (896 + 88 + 18) + (512 + 88 + 18)
    );
    assert_eq!(v["probability"], 0.0, "as the text says: {v}");
    let alone = v["table_probability"].as_f64().unwrap();
    assert!((0.99..0.9901).contains(&alone), "{v}");
    assert_eq!(v["resize"]["peak_memory_bytes"], 991_016 * 3 * 16);
}

#[test]
fn flags_that_do_not_fit_a_table_that_sizes_itself_are_refused_naming_them() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["-p", "0.99", "--rate", "10", "--window", "1h", "--max-memory", "64MiB"],
            "error: `--max-memory 64MiB` is the ceiling of a table that sizes itself: give it with \
             `--probability` and `--window` alone (no `--rate`, `--buckets` or `--memory`), or \
             leave it out\n",
        ),
        (
            &["-p", "0.99", "--window", "30s", "--max-memory", "32"],
            "error: `--max-memory 32` holds less than one set of 8 slots (64 bytes): give a \
             larger ceiling\n",
        ),
        (
            &["-p", "0.99", "--window", "30s", "--max-memory", "lots"],
            "invalid value 'lots' for '--max-memory <SIZE>'",
        ),
        (
            &["-p", "0.99", "--window", "30s", "--plot", "curve.svg"],
            "error: `--plot` draws a table for a known rate, and a table that sizes itself \
             (`--probability` and `--window` without `--rate`) has none: give `--rate` to draw \
             the table for it\n",
        ),
    ];
    refused(cases);
}
