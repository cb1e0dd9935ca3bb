"""The deployment profile: one pydantic model per table, the cross-field rules, and the loader.

This package's names are its API (``from kimi_deploy.profile import Profile, load_profile``); its modules hold
them, one concern each:

- :mod:`~kimi_deploy.profile.service`, :mod:`~kimi_deploy.profile.monitoring`, :mod:`~kimi_deploy.profile.fleet`
  (``[fleet]`` and ``[gateway]``), :mod:`~kimi_deploy.profile.kubernetes`, :mod:`~kimi_deploy.profile.startup`, :mod:`~kimi_deploy.profile.rollout`: one module per table, on the common
  :class:`~kimi_deploy.profile.base.Section`;
- :mod:`~kimi_deploy.profile.model`: ``[sglang]`` (from the option table) and :class:`Profile`;
- :mod:`~kimi_deploy.profile.rules`: the cross-field rules; :mod:`~kimi_deploy.profile.load`: TOML in and out;
- :mod:`~kimi_deploy.wire.net`: how the profile compares host names.

No module of the package imports the package itself, so these exports make no import cycle.
"""

from kimi_deploy.wire.net import host_key, is_loopback, not_one_host
from kimi_deploy.profile.base import MAX_SPAN_SEC, UINT_MAX
from kimi_deploy.profile.startup import MAX_PREFETCH_THREADS, Startup
from kimi_deploy.profile.rollout import Rollout
from kimi_deploy.profile.tune import Tune
from kimi_deploy.profile.service import CALENDAR, POSIX_NAME, Service, check_service_name, valid_service_name
from kimi_deploy.profile.monitoring import (JOB_NAME, LABEL_NAME, Monitoring, RESERVED_LABELS, RUNBOOK, RUNBOOK_DEFAULT,
                                            RUNBOOK_DEFAULT_DIGESTED, SLO,
                                            check_scrape_target)
from kimi_deploy.profile.fleet import Fleet, Gateway, IFNAME, MAX_NODES, MAX_REPLICAS, POLICY, Replica, SMG_VERSION
from kimi_deploy.profile.kubernetes import (COMMAND_NAME, CRON, CRON_FIELDS, DNS_LABEL, IMAGE, Kubernetes, LABEL_KEY,
                                            LABEL_VALUE, QUANTITY, check_cron, check_dns_label, check_image,
                                            CPU_QUANTITY, ClaimSource, HostPathSource, ImageSource, ModelVolume,
                                            OLD_MODEL_VOLUME_KEYS, POD_SECURITY_LEVELS)
from kimi_deploy.profile.model import (NAME_FIELD, Quality, DIGEST_OMITS_UNSET, DIGEST_SGLANG_KEYS, ENV_NAME, NIC_ENV, Profile,
                                       RANK_DUMMY_HEALTH, SGLang)
from kimi_deploy.profile.rules import (RESERVED_ENV, calendar_problem, check_rules, default_api_key_file,
                                       extra_args_problems, fleet_problems, gateway_problems, monitoring_problems,
                                       naming_warnings)
from kimi_deploy.profile.load import dump_profile, load_profile, parse_profile, toml_value
from kimi_deploy.values import SAFE_TOKEN

__all__ = ["CPU_QUANTITY", "ClaimSource", "HostPathSource", "ImageSource", "ModelVolume", "NAME_FIELD",
    "OLD_MODEL_VOLUME_KEYS", "POD_SECURITY_LEVELS", "Quality", "RUNBOOK_DEFAULT", "RUNBOOK_DEFAULT_DIGESTED", "CALENDAR", "COMMAND_NAME", "CRON", "CRON_FIELDS", "DIGEST_OMITS_UNSET", "DIGEST_SGLANG_KEYS", "DNS_LABEL",
    "ENV_NAME", "Fleet", "Gateway", "IFNAME", "IMAGE", "JOB_NAME", "Kubernetes", "LABEL_KEY", "LABEL_NAME",
    "LABEL_VALUE", "MAX_NODES", "MAX_REPLICAS", "MAX_SPAN_SEC", "Monitoring", "NIC_ENV", "POLICY", "POSIX_NAME",
    "Profile", "QUANTITY", "Rollout", "RANK_DUMMY_HEALTH", "RESERVED_ENV", "RESERVED_LABELS", "RUNBOOK", "Replica",
    "MAX_PREFETCH_THREADS", "SAFE_TOKEN", "SGLang", "SLO", "SMG_VERSION", "Service", "Startup", "Tune", "UINT_MAX", "calendar_problem", "check_cron",
    "check_dns_label", "check_image", "check_rules", "check_scrape_target", "check_service_name",
    "default_api_key_file", "dump_profile", "extra_args_problems", "fleet_problems", "gateway_problems",
    "host_key", "is_loopback", "load_profile", "monitoring_problems", "naming_warnings", "not_one_host",
    "parse_profile", "toml_value", "valid_service_name"]

