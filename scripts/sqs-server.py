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

Everything else is moto as published.
"""

import sys

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

if __name__ == "__main__":
    sys.exit(main())
