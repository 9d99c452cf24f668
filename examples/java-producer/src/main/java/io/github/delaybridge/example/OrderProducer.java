package io.github.delaybridge.example;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Instant;

/**
 * An order service in Java that schedules each order's timeout cancel through delaybridge without
 * the Go library: the order and its row in {@code delay_task} are written in ONE transaction, so the
 * task exists exactly when the order does (docs/table-contract.md). Paying an order cancels its task
 * in the same transaction as the payment.
 *
 * <pre>
 * OrderProducer create PREFIX COUNT TIMEOUT_MS   create COUNT orders PREFIX-0 .. PREFIX-(COUNT-1)
 * OrderProducer pay ORDER_ID...                  pay orders (and cancel their timeouts)
 * </pre>
 *
 * The database comes from DELAYBRIDGE_JDBC_URL (for example jdbc:mariadb://127.0.0.1:3306/delaybridge),
 * DELAYBRIDGE_JDBC_USER and DELAYBRIDGE_JDBC_PASSWORD, so no password shows in a process list.
 */
public final class OrderProducer {
    /** The topic the Go consumer subscribes to. */
    static final String TOPIC = "order-cancel";

    private OrderProducer() {}

    public static void main(String[] args) throws SQLException {
        if (args.length >= 4 && args[0].equals("create")) {
            try (Connection c = connect()) {
                createTable(c);
                int count = Integer.parseInt(args[2]);
                long timeoutMs = Long.parseLong(args[3]);
                for (int i = 0; i < count; i++) {
                    String id = args[1] + "-" + i;
                    createOrder(c, id, timeoutMs);
                    System.out.println("created " + id);
                }
            }
            return;
        }
        if (args.length >= 2 && args[0].equals("pay")) {
            try (Connection c = connect()) {
                for (int i = 1; i < args.length; i++) {
                    System.out.println((pay(c, args[i]) ? "paid " : "no unpaid order (timed out already, or never created): ") + args[i]);
                }
            }
            return;
        }
        System.err.println("usage: OrderProducer create PREFIX COUNT TIMEOUT_MS | pay ORDER_ID...");
        System.exit(2);
    }

    static Connection connect() throws SQLException {
        String url = System.getenv("DELAYBRIDGE_JDBC_URL");
        if (url == null || url.isEmpty()) {
            throw new IllegalStateException("DELAYBRIDGE_JDBC_URL is not set");
        }
        return DriverManager.getConnection(url, System.getenv("DELAYBRIDGE_JDBC_USER"), System.getenv("DELAYBRIDGE_JDBC_PASSWORD"));
    }

    static void createTable(Connection c) throws SQLException {
        try (Statement s = c.createStatement()) {
            s.execute("CREATE TABLE IF NOT EXISTS java_orders ("
                    + " id VARCHAR(64) NOT NULL PRIMARY KEY,"
                    + " status VARCHAR(16) NOT NULL,"
                    + " expire_ms BIGINT NOT NULL) ENGINE = InnoDB");
        }
    }

    /** Writes the order and its timeout task in one transaction. */
    static void createOrder(Connection c, String id, long timeoutMs) throws SQLException {
        // Epoch milliseconds, UTC by definition: never seconds, never a DATETIME.
        long now = Instant.now().toEpochMilli();
        long due = now + timeoutMs;
        c.setAutoCommit(false);
        try (PreparedStatement order = c.prepareStatement(
                     "INSERT INTO java_orders (id, status, expire_ms) VALUES (?, 'UNPAID', ?)");
             PreparedStatement task = c.prepareStatement(
                     "INSERT INTO delay_task (topic, task_key, due_ms, payload, headers, state, created_ms, updated_ms)"
                             + " VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)")) {
            order.setString(1, id);
            order.setLong(2, due);
            order.executeUpdate();
            task.setString(1, TOPIC);
            task.setBytes(2, id.getBytes(StandardCharsets.UTF_8));
            task.setLong(3, due);
            task.setBytes(4, ("{\"order\":\"" + id + "\"}").getBytes(StandardCharsets.UTF_8));
            task.setString(5, "{\"producer\":\"java\"}");
            task.setLong(6, now);
            task.setLong(7, now);
            task.executeUpdate();
            c.commit();
        } catch (SQLException e) {
            c.rollback();
            throw e;
        } finally {
            c.setAutoCommit(true);
        }
    }

    /**
     * Pays an order: cancels its task first (the consumer locks the task row before the order row,
     * and the same order everywhere avoids deadlocks), then marks the order paid, in one transaction.
     * Returns false, changing nothing, when there is no unpaid order of that id: the timeout won the
     * race (the task is done and the order cancelled), or the order never existed.
     */
    static boolean pay(Connection c, String id) throws SQLException {
        long now = Instant.now().toEpochMilli();
        c.setAutoCommit(false);
        try (PreparedStatement cancel = c.prepareStatement(
                     "UPDATE delay_task SET state = 'cancelled', updated_ms = ?"
                             + " WHERE topic = ? AND task_key = ? AND state IN ('pending', 'published', 'dead')");
             PreparedStatement paid = c.prepareStatement(
                     "UPDATE java_orders SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'")) {
            cancel.setLong(1, now);
            cancel.setString(2, TOPIC);
            cancel.setBytes(3, id.getBytes(StandardCharsets.UTF_8));
            cancel.executeUpdate();
            paid.setString(1, id);
            boolean ok = paid.executeUpdate() == 1;
            if (ok) {
                c.commit();
            } else {
                c.rollback();
            }
            return ok;
        } catch (SQLException e) {
            c.rollback();
            throw e;
        } finally {
            c.setAutoCommit(true);
        }
    }
}
