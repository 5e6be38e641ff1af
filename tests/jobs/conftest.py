import os
import sys

# The cells the job tests run live beside the training tests.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "training"))
