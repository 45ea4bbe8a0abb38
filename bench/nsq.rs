//! The NSQ client's per-message cost: decode a message frame, then encode its FIN.
//!
//! End-to-end throughput against the test broker lives in `tests/nsq.rs` (`nsq::throughput`,
//! ignored by default) because a bench binary cannot use the test support code.

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use nsq_dedupe::nsq::frame::{
    encode_message_frame, Command, Frame, FrameCodec, MessageId, RawMessage,
};
use tokio_util::codec::Decoder;

/// Frames per iteration: a read buffer's worth, as the connection sees them.
const BATCH: usize = 1000;

fn decode_and_fin(c: &mut Criterion) {
    let mut group = c.benchmark_group("nsq::frame");
    // One element = one message decoded and its FIN encoded.
    group.throughput(Throughput::Elements(BATCH as u64));
    for body_len in [100usize, 1024] {
        let mut wire = BytesMut::new();
        for i in 0..BATCH {
            let mut id = [b'0'; 16];
            id[8..].copy_from_slice(format!("{i:08x}").as_bytes());
            encode_message_frame(
                &RawMessage {
                    timestamp_ns: 1_700_000_000_000_000_000,
                    attempts: 1,
                    id: MessageId(id),
                    body: Bytes::from(vec![b'x'; body_len]),
                },
                &mut wire,
            );
        }
        let wire = wire.freeze();
        group.bench_with_input(
            BenchmarkId::new("decode_message_encode_fin", body_len),
            &wire,
            |b, wire| {
                let mut codec = FrameCodec::default();
                let mut out = BytesMut::with_capacity(BATCH * 21);
                b.iter_batched(
                    // Setup (not timed): a fresh read buffer holding BATCH frames.
                    || BytesMut::from(&wire[..]),
                    |mut input| {
                        out.clear();
                        while let Some(frame) = codec.decode(&mut input).expect("valid frames") {
                            if let Frame::Message(m) = frame {
                                Command::Fin(m.id).encode(&mut out);
                            }
                        }
                        out.len()
                    },
                    criterion::BatchSize::SmallInput,
                );
            },
        );
    }
    group.finish();
}

criterion_group!(benches, decode_and_fin);
