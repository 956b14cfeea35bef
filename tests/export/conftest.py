import pytest

from eyas.draft.io import save_draft
from export_fixtures import make_draft, make_target_dir


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    tdir, tmodel = make_target_dir(root / "target")
    draft = make_draft(tmodel)
    ddir = save_draft(draft, root / "draft", {"target": str(tdir), "metrics": {"eval": {"tau": 2.5}},
                                               "data": "unit-test"})
    return {"root": root, "target_dir": tdir, "target": tmodel, "draft": draft, "draft_dir": ddir}
