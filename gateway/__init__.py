"""kvfence gateway: authenticate tenants, derive namespaces, scope and audit every backend call."""
