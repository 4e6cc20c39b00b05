"""Every scalar of the TensorBoard event files in a directory, as TensorBoard's own reader
(`EventAccumulator`) loads them.

Usage: python3 tensorboard_scalars.py DIR
Prints JSON: {"tag": [[step, value], ...], ...}
"""

import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main(directory):
    acc = EventAccumulator(directory, size_guidance={"scalars": 0})
    acc.Reload()
    print(
        json.dumps(
            {
                tag: [[e.step, e.value] for e in acc.Scalars(tag)]
                for tag in acc.Tags()["scalars"]
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
