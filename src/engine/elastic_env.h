// The environment contract between hsdp-elastic and the engine (docs/elastic_launcher.md): the
// HSDP_ELASTIC_* parameters the launcher sets for every group it starts and the engine reads
// (resolveEngineConfig, config.cc). Declared once, here, beside their reader (hsdp/env.h); the
// launcher (tools/elastic_launch.cc) takes their names from these declarations.
#pragma once

#include "hsdp/env.h"

namespace hsdp::elastic_env {

inline const env::StringParam kEndpoint{
    "HSDP_ELASTIC_ENDPOINT", env::StringParam::Kind::kString, "",
    "etcd client URL (http://host:port) of an elastic job (docs/elastic.md): set, this process's "
    "group is one replica group of the job; unset, elastic mode is off. hsdp-elastic sets it."};
inline const env::StringParam kJob{"HSDP_ELASTIC_JOB", env::StringParam::Kind::kString, "hsdp",
                                   "Name of the elastic job in etcd ([A-Za-z0-9_.-]+)."};
inline const env::IntParam kGroupIndex{
    "HSDP_ELASTIC_GROUP_INDEX", env::Unset{"none"}, 0, 1 << 20,
    "This replica group's index in [0, HSDP_ELASTIC_GROUPS) (its name is g<index>; with "
    "HSDP_ELASTIC_DATA=keep its data slot). hsdp-elastic sets it."};
inline const env::IntParam kGroups{
    "HSDP_ELASTIC_GROUPS", env::Unset{"none"}, 1, 1 << 20,
    "Replica groups an elastic job starts with (its first step waits for all of them). "
    "hsdp-elastic sets it."};
inline const env::IntParam kRestarts{
    "HSDP_ELASTIC_RESTARTS", 0, 0, 1 << 20,
    "Times the launcher restarted this elastic group (hsdp-elastic sets it); > 0: the group "
    "replaces the member key its dead predecessor left in etcd instead of waiting out its lease."};

// Every parameter of the contract: the launcher sets each for a group (replacing a value of the
// same name it inherited) and passes each to every rank.
inline const env::Declared* const kContract[] = {&kEndpoint, &kJob, &kGroupIndex, &kGroups,
                                                 &kRestarts};

}  // namespace hsdp::elastic_env
