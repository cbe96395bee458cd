"""vlens loads only the TransformerLens modules it builds on (vlens.utils.tl_modules): `import vlens.core.model`
imports neither `datasets` nor `pandas` (TransformerLens's package __init__ does), and TransformerLens
imported afterwards behaves exactly as a plain `import transformer_lens` (each in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_vlens_model_loads_neither_datasets_nor_pandas_nor_does_using_a_cache():
    # ActivationCache's methods read transformer_lens.utilities at call time: answered from its submodules
    got = run_python(
        "import json, sys, vlens, vlens.core.model\n"
        "heavy = ('datasets', 'pandas', 'pyarrow', 'transformer_lens.model_bridge')\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "import torch\n"
        "from vlens.testing import tiny_hf_model\n"
        "model = vlens.HookedVLM.from_hf(tiny_hf_model(seed=0))\n"
        "_, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))\n"
        "stack = cache.accumulated_resid(layer=1, incl_mid=True)\n"
        "same = torch.equal(cache['resid_pre', 0], cache['blocks.0.hook_resid_pre'])\n"
        "print(json.dumps({'loaded': loaded, 'shape': list(stack.shape), 'same': same,\n"
        "                  'after': [m for m in heavy if m in sys.modules]}))"
    )
    assert got["loaded"] == [] and got["after"] == []
    assert got["same"] and got["shape"][0] == 3  # resid_pre 0, resid_mid 0, resid_pre 1


def test_transformer_lens_after_vlens_is_the_whole_library():
    got = run_python(
        "import json, sys, torch, vlens.core.model\n"
        "import transformer_lens as tl\n"
        "from transformer_lens.ActivationCache import ActivationCache as cache_class\n"
        "from vlens.core.cache import VLMActivationCache\n"
        "out = {'cache_is_class': tl.ActivationCache is cache_class and isinstance(cache_class, type),\n"
        "       'subclass': issubclass(VLMActivationCache, tl.ActivationCache),\n"
        "       'root_module_is_class': isinstance(tl.HookedRootModule, type),\n"
        "       'datasets_before': 'datasets' in sys.modules}\n"
        "from transformer_lens import FactoredMatrix\n"  # a from-import runs the package's __init__, as always
        "out['datasets_after'] = 'datasets' in sys.modules\n"
        "out['get_dataset'] = callable(tl.utilities.get_dataset)\n"
        "out['bridge'] = tl.TransformerBridge.__name__\n"
        "try:\n"
        "    from transformer_lens import HookedTransformer\n"
        "except ImportError as error:\n"
        "    out['removed'] = str(error)\n"
        "print(json.dumps(out))"
    )
    assert got["cache_is_class"] and got["subclass"] and got["root_module_is_class"]
    assert not got["datasets_before"] and got["datasets_after"] and got["get_dataset"]
    assert got["bridge"] == "TransformerBridge"
    assert "removed in TransformerLens 4.0" in got["removed"]  # the package's own __getattr__ answered
