"""The deployment profile: one pydantic model per table, the cross-field rules, and the loader.

This package's names are its API (``from kimi_deploy.profile import Profile, load_profile``); the modules
below hold them. No module of the package imports the package itself, so these exports make no cycle.
"""

from kimi_deploy.profile.model import (  # noqa: F401
    CALENDAR, COMMAND_NAME, CRON, CRON_FIELDS, DIGEST_OMITS_UNSET, DIGEST_SGLANG_KEYS,
    DNS_LABEL, ENV_NAME, Fleet, Gateway, IFNAME, IMAGE,
    JOB_NAME, Kubernetes, LABEL_KEY, LABEL_NAME, LABEL_VALUE, MAX_NODES,
    MAX_REPLICAS, MAX_SPAN_SEC, Monitoring, NIC_ENV, POLICY, POSIX_NAME,
    Profile, QUANTITY, RANK_DUMMY_HEALTH, RESERVED_ENV, RESERVED_LABELS, RUNBOOK,
    Replica, SAFE_TOKEN, SGLang, SLO, SMG_VERSION, Service,
    UINT_MAX, calendar_problem, check_cron, check_dns_label, check_image, check_rules,
    check_scrape_target, check_service_name, default_api_key_file, dump_profile, extra_args_problems, fleet_problems,
    gateway_problems, host_key, is_loopback, load_profile, monitoring_problems, naming_warnings,
    not_one_host, parse_profile, toml_value,
)
