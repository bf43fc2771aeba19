//! What a streaming effect's call has sent so far, shown to the run's readers on this node
//! while the call runs and never durable: the call's *partial* chunks. The call that commits
//! has its chunks written to the durable stream with its receipt; a call that fails or is cut
//! off has them taken back, which a reader sees as a reset. Held in the run's cell, so a run
//! that leaves memory takes its partial chunks with it — a reader then waits for what the
//! next call sends, or for the durable chunks.

use tokio::sync::watch;

/// The call of a streaming effect now running, and what it sent.
#[derive(Debug, Clone)]
pub(crate) struct LiveEffect {
    pub effect_id: String,
    /// The call's number within this entry of the effect, from 1.
    pub call: u32,
    /// Whether chunks sent before this call were given up: an earlier call's failure, or a
    /// call of an earlier process (the effect was found prepared and not committed).
    pub replaced: bool,
    /// The chunks this call sent, as canonical JSON with secrets redacted. Emptied when they
    /// are taken back.
    pub chunks: Vec<String>,
    /// Why the chunks were taken back, once they were.
    pub retracted: Option<String>,
}

/// A live run's slot for its streaming effect: the call, and the channel its readers wait on.
pub(crate) struct LiveSlot {
    pub effect: LiveEffect,
    pub changed: watch::Sender<u64>,
}

impl LiveSlot {
    pub fn new(effect: LiveEffect) -> Box<Self> {
        Box::new(LiveSlot { effect, changed: watch::Sender::new(0) })
    }

    /// Tells the readers something changed.
    pub fn touch(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// What a reader has shown of the run's partial chunks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Shown {
    /// The effect and call whose chunks it showed, if any.
    pub of: Option<(String, u32)>,
    /// How many of them.
    pub count: usize,
    /// Durable chunks came after them: they are replaced, and nothing more of that call is
    /// shown.
    pub superseded: bool,
}

impl Shown {
    /// A durable chunk was shown: it replaces every partial chunk shown before it.
    pub fn durable_shown(&mut self) {
        self.count = 0;
        self.superseded = true;
    }
}

/// What a reader shows next of a live effect, given what it has shown.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Take back what was shown of `effect_id`, for `reason`.
    Reset { effect_id: String, reason: String },
    /// Show these chunks of the call, numbered from `index`.
    Partial { effect_id: String, call: u32, index: usize, chunks: Vec<String> },
}

impl LiveEffect {
    /// Whether this is call `call` of `effect_id`.
    pub fn is_call(&self, effect_id: &str, call: u32) -> bool {
        self.effect_id == effect_id && self.call == call
    }

    /// What a reader that has shown `shown` is shown next, in order, and what it has shown
    /// after. A reader that meets a call it has not seen is first told to drop what it may
    /// hold of an earlier one — shown by this reader or by a process before this one.
    pub fn next_for(&self, shown: &mut Shown) -> Vec<Next> {
        let mut out = Vec::new();
        let this = (self.effect_id.clone(), self.call);
        if shown.superseded && shown.of.as_ref() == Some(&this) {
            return out;
        }
        if shown.of.as_ref() != Some(&this) {
            let dropped = shown.count > 0 || (shown.of.is_none() && self.replaced);
            if dropped {
                let effect_id = shown.of.as_ref().map_or(self.effect_id.clone(), |(e, _)| e.clone());
                out.push(Next::Reset { effect_id, reason: "a new call of the effect began".into() });
            }
            *shown = Shown { of: Some(this), count: 0, superseded: false };
        }
        if self.chunks.len() < shown.count {
            let reason = self.retracted.clone().unwrap_or_else(|| "the call failed".into());
            out.push(Next::Reset { effect_id: self.effect_id.clone(), reason });
            shown.count = 0;
        }
        if self.chunks.len() > shown.count {
            out.push(Next::Partial {
                effect_id: self.effect_id.clone(),
                call: self.call,
                index: shown.count,
                chunks: self.chunks[shown.count..].to_vec(),
            });
            shown.count = self.chunks.len();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(call: u32, chunks: &[&str], replaced: bool) -> LiveEffect {
        LiveEffect {
            effect_id: "answer".into(),
            call,
            replaced,
            chunks: chunks.iter().map(ToString::to_string).collect(),
            retracted: None,
        }
    }

    #[test]
    fn a_reader_is_shown_each_chunk_once_then_a_reset_when_the_call_fails_and_the_next_from_its_start() {
        let mut shown = Shown::default();
        let first = live(1, &["a", "b"], false);
        assert!(
            matches!(&first.next_for(&mut shown)[..], [Next::Partial { index: 0, chunks, .. }] if chunks.len() == 2)
        );
        assert!(first.next_for(&mut shown).is_empty(), "nothing new, nothing shown");
        let failed = LiveEffect { chunks: vec![], retracted: Some("HTTP 500".into()), ..first };
        assert!(
            matches!(&failed.next_for(&mut shown)[..], [Next::Reset { reason, .. }] if reason == "HTTP 500")
        );
        assert!(failed.next_for(&mut shown).is_empty(), "a reset is said once");
        let second = live(2, &["a"], true);
        assert!(matches!(&second.next_for(&mut shown)[..], [Next::Partial { call: 2, index: 0, .. }]));
    }

    #[test]
    fn durable_chunks_replace_the_partial_ones_and_the_call_is_not_shown_again() {
        let mut shown = Shown::default();
        let call = live(1, &["a", "b"], false);
        call.next_for(&mut shown);
        shown.durable_shown();
        assert!(call.next_for(&mut shown).is_empty(), "the committed call's slot is not shown again");
        let next = live(1, &["c"], false);
        let next = LiveEffect { effect_id: "second".into(), ..next };
        assert!(
            matches!(&next.next_for(&mut shown)[..], [Next::Partial { index: 0, .. }]),
            "no reset: nothing to drop"
        );
    }

    #[test]
    fn a_reader_that_showed_a_call_and_meets_the_next_resets_first() {
        let mut shown = Shown::default();
        live(1, &["a", "b"], false).next_for(&mut shown);
        let next = live(2, &["x"], true).next_for(&mut shown);
        assert!(matches!(&next[..], [Next::Reset { .. }, Next::Partial { call: 2, .. }]), "{next:?}");
    }

    #[test]
    fn a_new_reader_of_a_replaced_call_is_told_to_drop_what_an_earlier_process_showed() {
        let mut shown = Shown::default();
        let next = live(1, &["a"], true).next_for(&mut shown);
        assert!(matches!(&next[..], [Next::Reset { .. }, Next::Partial { .. }]), "{next:?}");
        let mut fresh = Shown::default();
        assert!(matches!(&live(1, &["a"], false).next_for(&mut fresh)[..], [Next::Partial { .. }]));
    }
}
