"""A LineProcess for the tests: answers each JSON line with the same object after a prefix, chatter before it."""

import json
import sys

for line in sys.stdin:
    sys.stdout.write("compiler chatter\n")
    sys.stdout.write("ECHO " + json.dumps(json.loads(line)) + "\n")
    sys.stdout.flush()
