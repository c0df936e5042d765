"""moto's SQS server, with one hot spot made cheap.

For every message it hands out, moto 5.2 checks the retention period by
computing all of the queue's attributes, which walks every message of the
queue several times: receiving a queue of n messages costs O(n^2), and a
2,000-message queue keeps the server busy for minutes. This check reads the
one attribute it needs, with the same result. Everything else is moto as
published.
"""

import sys

from moto.core.utils import unix_time
from moto.server import main
from moto.sqs.models import SQSBackend


def is_message_valid_based_on_retention_period(self, queue_name, message):
    retention_period = int(self.get_queue(queue_name).message_retention_period)
    return retention_period + message.sent_timestamp / 1000 > unix_time()


SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period

if __name__ == "__main__":
    sys.exit(main())
