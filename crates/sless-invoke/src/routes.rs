//! HTTP triggers' route table: extra public routes `/t/{ns}/{path}` to functions. The
//! controller fills it from the stored triggers; the gateway resolves requests in it.

use std::collections::HashMap;
use std::sync::RwLock;

/// One HTTP trigger's route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRoute {
    /// The trigger's name.
    pub trigger: String,
    /// Normalised path (`/orders`; `/` for everything).
    pub path: String,
    /// Upper-case methods it accepts.
    pub methods: Vec<String>,
    pub function: String,
    pub enabled: bool,
}

/// What a request to `/t/...` resolves to.
pub enum RouteMatch {
    Found(HttpRoute),
    MethodNotAllowed(Vec<String>),
    NotFound,
}

/// All namespaces' HTTP routes, kept in memory for the invoke path and updated
/// by the API whenever a trigger changes.
#[derive(Default)]
pub struct HttpRoutes {
    by_namespace: RwLock<HashMap<String, Vec<HttpRoute>>>,
}

impl HttpRoutes {
    /// Adds or replaces (by trigger name) a route.
    pub fn upsert(&self, namespace: &str, route: HttpRoute) {
        let mut all = self.by_namespace.write().unwrap_or_else(|e| e.into_inner());
        let routes = all.entry(namespace.to_string()).or_default();
        routes.retain(|r| r.trigger != route.trigger);
        routes.push(route);
        // Longest path first, so the most specific route wins.
        routes.sort_by_key(|r| std::cmp::Reverse(r.path.len()));
    }

    pub fn remove(&self, namespace: &str, trigger: &str) {
        let mut all = self.by_namespace.write().unwrap_or_else(|e| e.into_inner());
        if let Some(routes) = all.get_mut(namespace) {
            routes.retain(|r| r.trigger != trigger);
        }
    }

    /// Drops every route of a namespace (it was deleted).
    pub fn remove_namespace(&self, namespace: &str) {
        self.by_namespace
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(namespace);
    }

    pub fn resolve(&self, namespace: &str, path: &str, method: &str) -> RouteMatch {
        let all = self.by_namespace.read().unwrap_or_else(|e| e.into_inner());
        let Some(routes) = all.get(namespace) else {
            return RouteMatch::NotFound;
        };
        let hit = routes.iter().filter(|r| r.enabled).find(|r| {
            r.path == "/"
                || path == r.path
                || path
                    .strip_prefix(r.path.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        match hit {
            None => RouteMatch::NotFound,
            Some(r) if r.methods.iter().any(|m| m == method) => RouteMatch::Found(r.clone()),
            Some(r) => RouteMatch::MethodNotAllowed(r.methods.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(trigger: &str, path: &str, methods: &[&str], enabled: bool) -> HttpRoute {
        HttpRoute {
            trigger: trigger.into(),
            path: path.into(),
            methods: methods.iter().map(|m| m.to_string()).collect(),
            function: format!("fn-{trigger}"),
            enabled,
        }
    }

    fn found(r: RouteMatch) -> Option<String> {
        match r {
            RouteMatch::Found(r) => Some(r.trigger),
            _ => None,
        }
    }

    #[test]
    fn longest_prefix_wins_on_segment_boundaries() {
        let routes = HttpRoutes::default();
        routes.upsert("ns", route("all", "/", &["GET"], true));
        routes.upsert("ns", route("orders", "/orders", &["GET", "POST"], true));
        routes.upsert("ns", route("special", "/orders/special", &["GET"], true));
        assert_eq!(
            found(routes.resolve("ns", "/orders", "GET")).as_deref(),
            Some("orders")
        );
        assert_eq!(
            found(routes.resolve("ns", "/orders/12", "POST")).as_deref(),
            Some("orders")
        );
        assert_eq!(
            found(routes.resolve("ns", "/orders/special/x", "GET")).as_deref(),
            Some("special")
        );
        assert_eq!(
            found(routes.resolve("ns", "/ordersx", "GET")).as_deref(),
            Some("all")
        );
        assert!(matches!(
            routes.resolve("ns", "/orders/special", "POST"),
            RouteMatch::MethodNotAllowed(_)
        ));
        assert!(matches!(
            routes.resolve("other", "/orders", "GET"),
            RouteMatch::NotFound
        ));
    }

    #[test]
    fn disabled_and_removed_routes_do_not_match() {
        let routes = HttpRoutes::default();
        routes.upsert("ns", route("a", "/a", &["GET"], false));
        assert!(matches!(
            routes.resolve("ns", "/a", "GET"),
            RouteMatch::NotFound
        ));
        routes.upsert("ns", route("a", "/a", &["GET"], true));
        assert!(found(routes.resolve("ns", "/a", "GET")).is_some());
        routes.remove("ns", "a");
        assert!(matches!(
            routes.resolve("ns", "/a", "GET"),
            RouteMatch::NotFound
        ));
    }
}
