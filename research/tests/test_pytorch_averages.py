"""research/scripts/pytorch_averages.py and research/configs/ner_cnn_bilstm.cfg: the BiLSTM
baseline of research/sweeps/bilstm.json trains as spaCy's ner does, with averages applied."""
import subprocess
import sys
from pathlib import Path

import spacy

ROOT = Path(__file__).resolve().parents[2]


def test_the_patch_makes_pytorch_layers_apply_averages():
    """With the file passed to ``spacy train --code`` imported, any Thinc PyTorch layer applies
    the optimizer's averages; the package's upstream reproduction shows Thinc's own shim not
    doing so."""
    code = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'research' / 'scripts')!r})\n"
        "import pytorch_averages\n"
        "runpy.run_module('spacy_fsemicrf.averages_upstream', run_name='__main__')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "= 0.0000 (averages applied)" in out.stdout, out.stdout + out.stderr


def test_bilstm_baseline_trains_as_the_ner_baseline():
    """The same training block as configs/baselines/ner_cnn.cfg, and its CNN tok2vec under the
    BiLSTM."""
    ner = spacy.util.load_config(ROOT / "configs" / "baselines" / "ner_cnn.cfg")
    bilstm = spacy.util.load_config(ROOT / "research" / "configs" / "ner_cnn_bilstm.cfg")
    assert bilstm["training"] == ner["training"]
    assert bilstm["components"]["tok2vec"]["model"]["*"]["cnn"] == ner["components"]["tok2vec"]["model"]
