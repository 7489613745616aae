import sys
from pathlib import Path

# --import-mode=importlib puts no test folder on sys.path; these tests share one helper module.
sys.path.insert(0, str(Path(__file__).parent))
