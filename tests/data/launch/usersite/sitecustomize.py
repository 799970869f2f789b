# A user's own sitecustomize that eroica's bootstrap shadows; it must still run.
import os

os.environ["USER_SITECUSTOMIZE_RAN"] = "yes"
