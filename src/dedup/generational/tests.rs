//! Unit tests of the generations: the descriptor's text, read back as written.

use super::*;

#[test]
fn descriptors_read_back_as_written_and_refuse_other_values() {
    let shape = |sets: u64| Shape {
        format: 2,
        geometry: Geometry::new(sets * 4, 4).unwrap(),
    };
    let one = Descriptor {
        current: shape(65_536),
        previous: None,
    };
    assert_eq!(one.encode(), "v1 current=2:65536x4");
    let two = Descriptor {
        current: shape(262_144),
        previous: Some((shape(65_536), 1_700_000_000_000)),
    };
    assert_eq!(
        two.encode(),
        "v1 current=2:262144x4 previous=2:65536x4 since=1700000000000"
    );
    for descriptor in [one, two] {
        assert_eq!(Descriptor::parse("k", &descriptor.encode()), Ok(descriptor));
    }
    for bad in [
        "",
        "v2 current=2:65536x4",
        "v1 current=2:65536x3",
        "v1 current=2:65536x4 previous=2:4x4",
        "v1 current=2:0x4",
    ] {
        let error = Descriptor::parse("ns:table", bad).unwrap_err().to_string();
        assert!(error.contains("`ns:table`"), "{error}");
    }
}
