"""The DSV4Deployment API: typed spec and status models, and the CRD generated from them."""

GROUP = "inference.dsv4.dev"
VERSION = "v1alpha1"
KIND = "DSV4Deployment"
PLURAL = "dsv4deployments"
SINGULAR = "dsv4deployment"
SHORT_NAMES = ("dsv4",)
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"  # the CustomResourceDefinition's own name
