"""moto's SQS server, with one hot spot made cheap and FIFO order kept.

For every message it hands out, moto 5.2 checks the retention period by
computing all of the queue's attributes, which walks every message of the
queue several times: receiving a queue of n messages costs O(n^2), and a
2,000-message queue keeps the server busy for minutes. This check reads the
one attribute it needs, with the same result.

A FIFO group is held while one of its messages is in flight. moto 5.2.5
counts a message as in flight until the receive that hands it out again,
although its visibility timeout has ended: after a timeout, each of a
group's messages in turn found the group held by the ones after it, and
the group's *last* message came back first (SQS hands out its first). Here
a message in flight is one whose visibility timeout has not ended.

moto 5.2.5 drops the system attributes of each `SendMessageBatch` entry,
which SQS keeps as it does `SendMessage`'s (`AWSTraceHeader`, the X-Ray
context of a traced producer): here each entry's are sent with its message.

Everything else is moto as published.
"""

import sys
import threading

from moto.core.utils import unix_time
from moto.server import main
from moto.sqs.models import Queue, SQSBackend


def is_message_valid_based_on_retention_period(self, queue_name, message):
    retention_period = int(self.get_queue(queue_name).message_retention_period)
    return retention_period + message.sent_timestamp / 1000 > unix_time()


SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period


def pending_message_groups(self):
    return {
        message.group_id
        for message in self._pending_messages
        if message.group_id is not None and not message.visible
    }


Queue.pending_message_groups = property(pending_message_groups)

sent_one_by_one = SQSBackend.send_message_batch
# One batch at a time: the entries' attributes reach `send_message` through the backend, which the server's threads share.
batch_lock = threading.Lock()


def send_message_batch(self, queue_name, entries):
    # moto's batch sends each entry with `send_message`, in order, once each, without its system attributes.
    attributes = iter([entry.get("MessageSystemAttributes") for entry in entries.values()])
    send_message = self.send_message

    def with_system_attributes(*args, **kwargs):
        kwargs.setdefault("system_attributes", next(attributes, None))
        return send_message(*args, **kwargs)

    with batch_lock:
        self.send_message = with_system_attributes
        try:
            return sent_one_by_one(self, queue_name, entries)
        finally:
            del self.send_message


SQSBackend.send_message_batch = send_message_batch

if __name__ == "__main__":
    sys.exit(main())
