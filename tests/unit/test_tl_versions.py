"""vlens runs on the TransformerLens releases SAELens accepts (3.9) and on 4.x: the version is checked at
import with a message naming the range, and the hook machinery works where TransformerLens 3.x's
`HookPoint.add_hook` returns no handle. (.ci/run installs vlens with sae-lens in a fresh venv and runs
tools/check_saelens_pair.py on transformer-lens 3.9 itself.)"""

from __future__ import annotations

import threading

import pytest
import torch
from transformer_lens.hook_points import HookPoint as TLHookPoint

from vlens.core.hooks import OWNER_ATTRIBUTE, HookPoint, thread_token
from vlens.utils.tl_modules import check_transformer_lens_version


@pytest.mark.parametrize("version", ["3.9.0", "3.9.1rc1", "4.0.0", "4.3.0", "4.10.2"])
def test_supported_transformer_lens_versions_pass(version):
    check_transformer_lens_version(version)


@pytest.mark.parametrize("version", ["2.16.1", "3.8.1", "5.0.0", "garbage"])
def test_other_transformer_lens_versions_are_refused_naming_the_range(version):
    with pytest.raises(ImportError, match=r"transformer-lens >=3\.9,<5.*" + version.replace(".", r"\.")):
        check_transformer_lens_version(version)


def test_hooks_work_where_add_hook_returns_no_handle(monkeypatch):
    original = TLHookPoint.add_hook

    def like_3x(self, *args, **kwargs):  # TransformerLens 3.x: the handle goes into the list, None comes back
        original(self, *args, **kwargs)
        return None

    monkeypatch.setattr(TLHookPoint, "add_hook", like_3x)
    point = HookPoint()
    point.name = "hook_x"
    point.add_hook(lambda x, hook: x + 1)
    point.add_hook(lambda x, hook: x * 10, prepend=True)
    point.add_hook(lambda x, hook: x - 1, is_permanent=True)
    me = thread_token()
    assert [getattr(h, OWNER_ATTRIBUTE) for h in point.fwd_hooks] == [me, me, None]  # the same token objects
    assert point(torch.tensor(1.0)).item() == (1 * 10 + 1) - 1
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(out=point(torch.tensor(1.0)).item()))
    thread.start()
    thread.join()
    assert seen["out"] == 0.0  # another thread runs only the permanent hook
    point.remove_hooks()
    assert len(point.fwd_hooks) == 1 and point(torch.tensor(1.0)).item() == 0.0
