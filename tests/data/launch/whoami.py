"""Print this rank's identity and write the pid that owns eroica (from the claim file)."""
import os
import sys

rank = os.environ["RANK"]
claim = os.environ.get("EROICA_OWNER_CLAIM", "")
owner = open(claim).read() if claim and os.path.exists(claim) else ""
print(f"whoami rank={rank} world={os.environ['WORLD_SIZE']} local={os.environ['LOCAL_RANK']} "
      f"pid={os.getpid()} owner={owner} args={' '.join(sys.argv[1:])}", flush=True)
print(f"to-stderr rank={rank}", file=sys.stderr, flush=True)
marker = os.environ.get("USER_SITECUSTOMIZE_MARK")
if marker:
    print(f"user-sitecustomize={os.environ.get('USER_SITECUSTOMIZE_RAN', 'no')}", flush=True)
