//! A message shown in the user's words: [`FlagOrigins::show`] puts the origins in effect on
//! this thread while the message is written, and each [`Named`](super::Named) setting in it
//! (and a config error's key) asks [`in_effect`] how the user gave it. So an error holds keys
//! alone, wherever it was made and however deep in a chain of causes, and is put in the
//! user's words once, where it is shown: the binary's report and the few log lines that name
//! settings. Written without them, a message names keys, as a library user sees it.

use std::cell::RefCell;
use std::fmt;

use super::FlagOrigins;

thread_local! {
    /// The origins of the message being written on this thread, if it is shown in the
    /// user's words.
    static IN_EFFECT: RefCell<Option<FlagOrigins>> = const { RefCell::new(None) };
}

/// `value` written with its settings named as [`FlagOrigins::show`]'s origins say.
#[derive(Debug)]
pub struct Shown<'a, T> {
    names: &'a FlagOrigins,
    value: T,
}

impl FlagOrigins {
    /// `value` (an error, a wording, a whole chain of causes) shown with each setting it
    /// names as the user gave it: by the flag or variable that set it, or, with no config
    /// file, by the flag that sets it.
    pub fn show<T: fmt::Display>(&self, value: T) -> Shown<'_, T> {
        Shown { names: self, value }
    }
}

impl<T: fmt::Display> fmt::Display for Shown<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let outer = IN_EFFECT.with(|names| names.replace(Some(self.names.clone())));
        let written = self.value.fmt(f);
        IN_EFFECT.with(|names| names.replace(outer));
        written
    }
}

/// `how` of the origins in effect, if a message is being shown in the user's words.
pub(crate) fn in_effect<R>(how: impl FnOnce(&FlagOrigins) -> Option<R>) -> Option<R> {
    IN_EFFECT.with(|names| names.borrow().as_ref().and_then(how))
}
