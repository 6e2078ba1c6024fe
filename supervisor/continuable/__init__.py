"""Continuable children: activations, durable delivery, ownership, settlement, drain.

An **activation** is one residency epoch of a continuable child in this
supervisor: its lease (epoch), its driver task, the children it owns. At most
one per session across all processes (the lease guarantees it).

Delivery is durable: ``start_continuable``, ``followup`` and ``report_from``
return a message id only once the message is fsync'd in the recipient's
mailbox. The log records consumption (``message/accepted``), so after any
crash every accepted message is delivered exactly once, in order, when the
child is next activated — by any supervisor.

Lifecycle: running (a turn runs or waking work is queued) → waiting
(quiescent, owns live children; lease ``idle``) → settled (quiescent, owns
none) → disposed: lease released, the settlement notice delivered durably to
the parent's mailbox *before* the parent's ownership is released,
``subagent/end`` emitted. Disposal is child-first; cancellation goes top-down.

Layout (each module owns one concern; ``manager`` is the façade):

    manager          ContinuationManager: builds the others, runs each activation's task
    activation       Activation (its field groups and their writers), ActivationTable
    admission        whether new work may begin below a parent (drain, close)
    materialization  fresh start and cold resume → install
    delivery         followup, send, report → a durable mailbox
    watcher          mailbox and control files other processes append to
    driver           the turn loop of one activation
    teardown         interrupt, disposal, drain, close
    settlement       the epoch's stop reason and the notice texts

Choices where the design leaves room (documented in README):
* ``interrupt`` cancels only the current turn; queued waking messages then
  run at once (no "wake gap": nothing waits for another send to start them).
* a busy parent receives a settlement notice as a queued waking message (a
  turn after its current one), not mid-turn; a parent below a closing
  lineage receives it quiet.
* ``drain`` discards the pending mailbox of the activations it tears down
  (``message/discarded``); closing the supervisor does not: their messages
  stay pending and are delivered on the next activation.
* a cold resume runs under the child's own log: its last ``sandbox/mode``
  (never widened by a restart), its descriptor's persona and tool filter.
  The ``budget`` of ``start_continuable`` bounds each turn of the first
  residency epoch only; it is not persisted, so a resumed child runs
  unbudgeted.
* the program is found through the provider named in the descriptor:
  registered, or unregistered from this supervisor since (the registry
  remembers it), or a built-in program of that name. A followup that needs
  a cold resume nobody can run fails ``NO_PROVIDER`` before it is accepted.
"""

from .activation import Activation, ActivationIdentity, LeaseState, Lifecycle
from .manager import ContinuationManager
from .settlement import SUMMARIES, epoch_stop_reason, settlement_text

__all__ = [
    "Activation",
    "ActivationIdentity",
    "LeaseState",
    "Lifecycle",
    "ContinuationManager",
    "SUMMARIES",
    "epoch_stop_reason",
    "settlement_text",
]
