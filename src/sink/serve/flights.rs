//! The messages in flight to consumers, by the IDs this endpoint gave them.
//!
//! An ID is 16 hexadecimal digits of a number whose low 32 bits are the message's place in a
//! table of places reused as messages leave, and whose high 32 bits count the messages sent:
//! a FIN finds its message by its place, without hashing, and an ID is unique among
//! everything in flight here, even when two upstream nsqd gave their messages the same ID; a
//! late answer to a place reused since is refused, as nsqd refuses an ID no longer in flight.
//!
//! Places are reused oldest first: consumers answer mostly in the order they were sent, so
//! the places go round the table as a ring, and a run of answers reads neighbouring entries
//! instead of one scattered cache line each.

use std::collections::VecDeque;

use crate::nsq::frame::MessageId;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The ID of the message numbered `number`.
fn id_of(number: u64) -> MessageId {
    let mut id = [0u8; 16];
    for (i, digit) in id.iter_mut().enumerate() {
        *digit = HEX[((number >> (60 - 4 * i)) & 0xf) as usize];
    }
    MessageId(id)
}

/// The number an ID of ours holds, if it is one.
fn number_of(id: &MessageId) -> Option<u64> {
    id.0.iter().try_fold(0u64, |number, &digit| {
        let value = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => return None,
        };
        Some(number << 4 | u64::from(value))
    })
}

/// A table of `T` by the IDs it gives them.
pub(crate) struct Flights<T> {
    places: Vec<Option<(u64, T)>>,
    /// Places free for reuse, the longest free first.
    free: VecDeque<u32>,
    len: usize,
    sent: u32,
}

impl<T> Default for Flights<T> {
    fn default() -> Self {
        Flights {
            places: Vec::new(),
            free: VecDeque::new(),
            len: 0,
            sent: 0,
        }
    }
}

impl<T> Flights<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Puts `value` in flight under a new ID.
    pub(crate) fn insert(&mut self, value: T) -> MessageId {
        self.sent = self.sent.wrapping_add(1);
        let place = match self.free.pop_front() {
            Some(place) => place,
            None => {
                self.places.push(None);
                u32::try_from(self.places.len() - 1).expect("fewer than 2^32 messages in flight")
            }
        };
        let number = u64::from(self.sent) << 32 | u64::from(place);
        self.places[place as usize] = Some((number, value));
        self.len += 1;
        id_of(number)
    }

    /// Where `id` is, if it is in flight.
    fn place(&self, id: &MessageId) -> Option<usize> {
        let number = number_of(id)?;
        let place = (number & u64::from(u32::MAX)) as usize;
        match self.places.get(place) {
            Some(Some((held, _))) if *held == number => Some(place),
            _ => None,
        }
    }

    pub(crate) fn get(&self, id: &MessageId) -> Option<&T> {
        let place = self.place(id)?;
        self.places[place].as_ref().map(|(_, value)| value)
    }

    pub(crate) fn get_mut(&mut self, id: &MessageId) -> Option<&mut T> {
        let place = self.place(id)?;
        self.places[place].as_mut().map(|(_, value)| value)
    }

    pub(crate) fn remove(&mut self, id: &MessageId) -> Option<T> {
        let place = self.place(id)?;
        self.take(place)
    }

    fn take(&mut self, place: usize) -> Option<T> {
        let (_, value) = self.places[place].take()?;
        self.free.push_back(place as u32);
        self.len -= 1;
        Some(value)
    }

    /// Takes every value for which `leaves` is true, in no particular order.
    pub(crate) fn take_if(&mut self, mut leaves: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut taken = Vec::new();
        for place in 0..self.places.len() {
            if matches!(&self.places[place], Some((_, value)) if leaves(value)) {
                taken.extend(self.take(place));
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_in_flight_and_a_reused_place_refuses_the_old_id() {
        let mut flights = Flights::default();
        let a = flights.insert("a");
        let b = flights.insert("b");
        assert_ne!(a, b);
        assert_eq!(a.0, *b"0000000100000000");
        assert_eq!(flights.remove(&a), Some("a"));
        let c = flights.insert("c");
        assert_ne!(c, a, "the place of a is reused under another ID");
        assert_eq!(flights.get(&a), None);
        assert_eq!(flights.remove(&a), None);
        assert_eq!((flights.get(&b), flights.get(&c)), (Some(&"b"), Some(&"c")));
        assert_eq!(flights.len(), 2);
        for foreign in [
            *b"0123456789abcdef",
            *b"zzzzzzzzzzzzzzzz",
            *b"0000000200000009",
        ] {
            assert_eq!(flights.get(&MessageId(foreign)), None);
        }
        let mut left = flights.take_if(|v| *v == "b");
        left.extend(flights.take_if(|_| true));
        assert_eq!((left, flights.len()), (vec!["b", "c"], 0));
    }

    #[test]
    fn places_are_reused_the_longest_free_first() {
        let mut flights = Flights::default();
        let ids: Vec<MessageId> = (0..3).map(|n| flights.insert(n)).collect();
        assert_eq!(flights.remove(&ids[1]), Some(1));
        assert_eq!(flights.remove(&ids[0]), Some(0));
        let next = flights.insert(3);
        assert_eq!(
            &next.0[8..],
            b"00000001",
            "the place of the first one freed"
        );
    }
}
