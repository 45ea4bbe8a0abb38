//! One handler call's records as consumers answer them: the results, handed over by the
//! dispatcher as they come, and the stream of parts the call reads ([`Answers`]). The call is
//! woken once per run of answers (a consumer's FINs and REQs read at once are settled under
//! one lock), not once per record, and not only when its last record is answered: a consumer
//! that answers a burst's records in two of its own batches gets the first batch's records
//! settled upstream while it still holds the second.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};

use crate::sink::{HandlerError, Part};

/// What the records of one call share.
struct Call {
    /// Results not read by the call yet, each with its record's place in the call.
    answered: Mutex<Part>,
    /// The call's task, once it waits; taken by the first answer after it registered, so a
    /// run of answers wakes it once.
    waker: AtomicWaker,
    /// Set when the call's stream is dropped (abandoned at shutdown): its records that still
    /// wait for a consumer are not sent.
    abandoned: AtomicBool,
}

/// A record's place in its handler call; answered exactly once, by [`Reply::resolve`] or, if
/// the dispatcher drops it unanswered, as a failure.
pub(crate) struct Reply {
    call: Arc<Call>,
    index: usize,
    answered: bool,
}

impl Reply {
    /// Answers each reply with its result, exactly once: the
    /// replies of one call next to each other are pushed under one lock of its results and
    /// take its waker once, rather than once each, since the call's task reads those results
    /// from another core. Returns the wakers of the calls to wake once the caller has
    /// released its lock.
    pub(crate) fn resolve_all(mut resolved: Vec<(Reply, Result<(), HandlerError>)>) -> Vec<Waker> {
        let mut wakers = Vec::new();
        let mut at = 0;
        while at < resolved.len() {
            let call = resolved[at].0.call.clone();
            let run = resolved[at..]
                .iter()
                .take_while(|(reply, _)| Arc::ptr_eq(&reply.call, &call))
                .count();
            {
                let mut answered = call.lock();
                for (reply, result) in &mut resolved[at..at + run] {
                    reply.answered = true;
                    answered.push((reply.index, std::mem::replace(result, Ok(()))));
                }
            }
            wakers.extend(call.waker.take());
            at += run;
        }
        wakers
    }

    /// Whether the call no longer waits for this record.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.call.abandoned.load(Ordering::Relaxed)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.answered {
            let stopped = HandlerError::Retry("the serve endpoint stopped".into());
            if let Some(waker) = self.call.answer(self.index, Err(stopped)) {
                waker.wake();
            }
        }
    }
}

impl Call {
    fn answer(&self, index: usize, result: Result<(), HandlerError>) -> Option<Waker> {
        self.lock().push((index, result));
        // After the push: a call that registered before it finds the result when woken, one
        // that registers after it finds the result when it looks again.
        self.waker.take()
    }

    /// The results not read yet.
    fn read(&self) -> Part {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Part> {
        self.answered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The results of one handler call's records, in parts as consumers answer them; the stream
/// ends once every record is answered.
pub(crate) struct Answers {
    call: Arc<Call>,
    count: usize,
    /// Records whose results were not read yet.
    left: usize,
}

impl Answers {
    /// A call of `count` records, and the reply of each, in order.
    pub(crate) fn new(count: usize) -> (Answers, impl Iterator<Item = Reply>) {
        let call = Arc::new(Call {
            answered: Mutex::new(Vec::new()),
            waker: AtomicWaker::new(),
            abandoned: AtomicBool::new(false),
        });
        let replies = {
            let call = call.clone();
            (0..count).map(move |index| Reply {
                call: call.clone(),
                index,
                answered: false,
            })
        };
        let answers = Answers {
            call,
            count,
            left: count,
        };
        (answers, replies)
    }

    /// Every record's result, in the records' order, once each is answered.
    pub(crate) async fn in_order(mut self) -> Vec<Result<(), HandlerError>> {
        let mut results = vec![Ok(()); self.count];
        while let Some(part) = self.next().await {
            for (index, result) in part {
                results[index] = result;
            }
        }
        results
    }
}

impl Stream for Answers {
    type Item = Part;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Part>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let mut part = self.call.read();
        if part.is_empty() {
            self.call.waker.register(cx.waker());
            // Read again: an answer may have come before the waker was registered.
            part = self.call.read();
            if part.is_empty() {
                return Poll::Pending;
            }
        }
        self.left = self.left.saturating_sub(part.len());
        Poll::Ready(Some(part))
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.call.abandoned.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// Answers one record; its call's waker if this answer took it.
    fn resolve(reply: Reply, result: Result<(), HandlerError>) -> Option<Waker> {
        Reply::resolve_all(vec![(reply, result)]).pop()
    }

    #[test]
    fn each_run_of_answers_is_a_part_and_wakes_the_call_once() {
        let (mut answers, replies) = Answers::new(3);
        let mut replies: Vec<Reply> = replies.collect();
        let third = replies.pop().unwrap();
        let second = replies.pop().unwrap();
        let first = replies.pop().unwrap();
        assert!(answers.next().now_or_never().is_none(), "nothing yet");
        // The first answer after the call waited hands back its waker; the next one of the
        // same run does not.
        assert!(resolve(third, Err(HandlerError::Retry("requeued".into()))).is_some());
        assert!(resolve(first, Ok(())).is_none());
        assert_eq!(
            answers.next().now_or_never().unwrap(),
            Some(vec![
                (2, Err(HandlerError::Retry("requeued".into()))),
                (0, Ok(()))
            ])
        );
        assert!(answers.next().now_or_never().is_none(), "one left");
        assert!(resolve(second, Ok(())).is_some());
        assert_eq!(
            answers.next().now_or_never().unwrap(),
            Some(vec![(1, Ok(()))])
        );
        assert_eq!(answers.next().now_or_never().unwrap(), None, "all answered");
    }

    #[test]
    fn a_reply_dropped_unanswered_fails_its_record_and_a_dropped_call_is_abandoned() {
        let (answers, replies) = Answers::new(2);
        let mut replies: Vec<Reply> = replies.collect();
        drop(replies.pop());
        assert!(!replies[0].is_abandoned());
        drop(answers);
        assert!(replies[0].is_abandoned());
        let (answers, replies) = Answers::new(1);
        drop(replies.collect::<Vec<_>>());
        assert_eq!(
            answers.in_order().now_or_never().unwrap(),
            vec![Err(HandlerError::Retry(
                "the serve endpoint stopped".into()
            ))]
        );
    }

    #[test]
    fn records_answered_together_take_each_calls_waker_once() {
        let (mut one, replies) = Answers::new(2);
        let ones: Vec<Reply> = replies.collect();
        let (mut other, replies) = Answers::new(1);
        let others: Vec<Reply> = replies.collect();
        assert!(one.next().now_or_never().is_none());
        assert!(other.next().now_or_never().is_none());
        let mut resolved: Vec<_> = ones.into_iter().map(|reply| (reply, Ok(()))).collect();
        resolved.extend(others.into_iter().map(|reply| (reply, Ok(()))));
        assert_eq!(Reply::resolve_all(resolved).len(), 2, "one waker per call");
        assert_eq!(
            one.next().now_or_never().unwrap(),
            Some(vec![(0, Ok(())), (1, Ok(()))]),
            "one part"
        );
        assert_eq!(other.next().now_or_never().unwrap(), Some(vec![(0, Ok(()))]));
        assert_eq!(one.next().now_or_never().unwrap(), None, "all answered");
    }
}
