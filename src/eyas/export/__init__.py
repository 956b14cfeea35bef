"""Export eyas drafts for engines (vLLM speculators format, SGLang), import published drafts, and the key
contract both directions are checked against. See CONTRIBUTING.md "Cross-stage APIs"."""

from eyas.export.files import ContractError, check_contract, detect_format, read_export
from eyas.export.importers import import_draft
from eyas.export.writers import export_sglang, export_vllm

__all__ = ["ContractError", "check_contract", "detect_format", "export_sglang", "export_vllm", "import_draft",
           "read_export"]
