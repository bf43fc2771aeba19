//! A live run's actor slot: the actor is spawned by the first inbound event that needs one
//! and stops once it has been idle for its grace (see [`Mailbox`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ractor::{ActorId, ActorRef};

use crate::kernel::inbox::RunMsg;

/// A live run's actor, spawned by the first inbound event that needs one (a message, a
/// request, an alarm, an activation of a live run) and stopped once it has been idle for
/// [`ACTOR_IDLE_GRACE`](crate::limits::ACTOR_IDLE_GRACE). A run that only runs its fiber — most
/// recovered runs — never pays for an actor, and one whose events are over stops paying: a
/// ractor actor costs more memory and time than the whole rest of an activation, and a
/// burst of alarms to many runs spent a fifth of its CPU on the kernel zeroing fresh memory
/// for actors that then sat idle (`bench alarms`). Closed when the run leaves memory, so an
/// event that still holds the old cell cannot spawn an actor for a run that is gone. The
/// cell makes its mailbox at the first event that asks for it.
///
/// Each event is counted from the moment its sender takes the actor ([`Mailbox::actor`])
/// until the actor has handled it ([`Mailbox::handled`]). Senders count under the slot's
/// lock, and the actor gives up the slot only under that lock, with nothing counted and no
/// event taken since it went idle ([`Mailbox::retire_if_idle`]), so no event is ever sent to
/// an actor that is stopping: the next one spawns a fresh actor.
#[derive(Default)]
pub(crate) struct Mailbox {
    slot: tokio::sync::Mutex<Slot>,
    /// Events taken for the actor and not yet handled by it.
    on_the_way: AtomicUsize,
    /// Events ever taken: an idle actor stops only if none was taken since it went idle.
    taken: AtomicU64,
}

#[derive(Default)]
enum Slot {
    #[default]
    Empty,
    Open(ActorRef<RunMsg>),
    Closed,
}

impl Mailbox {
    /// The actor, for one event the caller sends it right away, spawned by `spawn` if there
    /// is none; `None` once the run left memory. `spawn` is not polled when the actor exists.
    /// The event counts as on its way until the actor has handled it.
    pub async fn actor<E>(
        &self,
        spawn: impl std::future::Future<Output = Result<ActorRef<RunMsg>, E>>,
    ) -> Result<Option<ActorRef<RunMsg>>, E> {
        let mut slot = self.slot.lock().await;
        let actor = match &*slot {
            Slot::Open(actor) => actor.clone(),
            Slot::Closed => return Ok(None),
            Slot::Empty => {
                let actor = spawn.await?;
                *slot = Slot::Open(actor.clone());
                actor
            }
        };
        self.on_the_way.fetch_add(1, Ordering::SeqCst);
        self.taken.fetch_add(1, Ordering::SeqCst);
        Ok(Some(actor))
    }

    /// Called by the actor after each event it handled. When nothing else is on its way, a
    /// mark of this moment, for [`Mailbox::retire_if_idle`] once the grace is over.
    pub fn handled(&self) -> Option<u64> {
        let before = self.on_the_way.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        (before == Ok(1)).then(|| self.taken.load(Ordering::SeqCst))
    }

    /// Empties the slot if the actor `me` still fills it, nothing is on its way and no event
    /// was taken since `mark`. True when `me` is to stop.
    pub async fn retire_if_idle(&self, me: ActorId, mark: u64) -> bool {
        let mut slot = self.slot.lock().await;
        if self.on_the_way.load(Ordering::SeqCst) != 0 || self.taken.load(Ordering::SeqCst) != mark {
            return false;
        }
        match &*slot {
            Slot::Open(actor) if actor.get_id() == me => {
                *slot = Slot::Empty;
                true
            }
            Slot::Open(_) | Slot::Empty | Slot::Closed => false,
        }
    }

    /// Closes the mailbox for good; the actor to stop, if one is there.
    pub async fn close(&self) -> Option<ActorRef<RunMsg>> {
        match std::mem::replace(&mut *self.slot.lock().await, Slot::Closed) {
            Slot::Open(actor) => Some(actor),
            Slot::Empty | Slot::Closed => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use ractor::{Actor, ActorProcessingErr};

    use super::*;

    /// An actor that takes `RunMsg`s and handles none: the mailbox only needs its address.
    struct Silent;

    impl Actor for Silent {
        type Msg = RunMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<RunMsg>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    /// Takes the mailbox's actor for one event, counting the spawns it asks for.
    async fn take(mailbox: &Mailbox, spawns: &AtomicU32) -> Option<ActorRef<RunMsg>> {
        let spawn = async {
            spawns.fetch_add(1, Ordering::SeqCst);
            Actor::spawn(None, Silent, ()).await.map(|(actor, _)| actor)
        };
        mailbox.actor(spawn).await.expect("spawn")
    }

    #[tokio::test]
    async fn an_idle_actor_gives_up_the_slot_and_the_next_event_spawns_anew() {
        let (mailbox, spawns) = (Mailbox::default(), AtomicU32::new(0));
        let first = take(&mailbox, &spawns).await.expect("open");
        let mark = mailbox.handled().expect("nothing else on its way: idle");
        assert!(mailbox.retire_if_idle(first.get_id(), mark).await, "still idle: it stops");
        let second = take(&mailbox, &spawns).await.expect("open");
        assert_ne!(first.get_id(), second.get_id(), "a fresh actor");
        assert_eq!(spawns.load(Ordering::SeqCst), 2);
        first.stop(None);
        second.stop(None);
    }

    #[tokio::test]
    async fn an_actor_keeps_the_slot_while_another_event_is_on_its_way() {
        let (mailbox, spawns) = (Mailbox::default(), AtomicU32::new(0));
        let actor = take(&mailbox, &spawns).await.expect("open");
        let again = take(&mailbox, &spawns).await.expect("open");
        assert_eq!(actor.get_id(), again.get_id(), "the same actor, not spawned twice");
        assert_eq!(mailbox.handled(), None, "one event is still on its way");
        let mark = mailbox.handled().expect("idle");
        let third = take(&mailbox, &spawns).await.expect("open");
        assert_eq!(third.get_id(), actor.get_id(), "taken again during the grace");
        assert!(!mailbox.retire_if_idle(actor.get_id(), mark).await, "an event is on its way");
        let mark = mailbox.handled().expect("idle");
        assert!(mailbox.retire_if_idle(actor.get_id(), mark).await);
        assert_eq!(spawns.load(Ordering::SeqCst), 1);
        actor.stop(None);
    }

    #[tokio::test]
    async fn an_actor_that_was_busy_again_during_the_grace_is_kept() {
        let (mailbox, spawns) = (Mailbox::default(), AtomicU32::new(0));
        let actor = take(&mailbox, &spawns).await.expect("open");
        let first_idle = mailbox.handled().expect("idle");
        take(&mailbox, &spawns).await.expect("open");
        let second_idle = mailbox.handled().expect("idle again");
        assert!(!mailbox.retire_if_idle(actor.get_id(), first_idle).await, "an event came since");
        assert!(mailbox.retire_if_idle(actor.get_id(), second_idle).await, "none since the last");
        assert_eq!(spawns.load(Ordering::SeqCst), 1);
        actor.stop(None);
    }

    #[tokio::test]
    async fn a_closed_mailbox_hands_its_actor_to_the_closer_and_never_spawns_again() {
        let (mailbox, spawns) = (Mailbox::default(), AtomicU32::new(0));
        let actor = take(&mailbox, &spawns).await.expect("open");
        let closed = mailbox.close().await.expect("the actor, to stop");
        assert_eq!(closed.get_id(), actor.get_id());
        let mark = mailbox.handled().expect("idle");
        assert!(!mailbox.retire_if_idle(actor.get_id(), mark).await, "the closer stops it");
        assert!(take(&mailbox, &spawns).await.is_none(), "the run left memory");
        assert_eq!(spawns.load(Ordering::SeqCst), 1);
        actor.stop(None);
    }

    #[tokio::test]
    async fn an_uncounted_report_neither_wraps_the_count_nor_marks_the_actor_idle() {
        let (mailbox, spawns) = (Mailbox::default(), AtomicU32::new(0));
        let actor = take(&mailbox, &spawns).await.expect("open");
        assert!(mailbox.handled().is_some());
        assert_eq!(mailbox.handled(), None, "nothing was counted");
        take(&mailbox, &spawns).await.expect("open");
        let mark = mailbox.handled().expect("the count still works");
        assert!(mailbox.retire_if_idle(actor.get_id(), mark).await);
        actor.stop(None);
    }
}
